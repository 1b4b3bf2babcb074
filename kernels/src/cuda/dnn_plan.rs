//! A training convolution's three directions on cuDNN ([`ConvPlan`]), each with the method
//! the one search chose (`conv_search::best_method`: the legacy API's measured algorithm or a
//! backend engine), and the choice as data ([`PlanChoice`]) for the cache file.

use super::blas::Prec;
use super::conv_search::{best_method, Chosen, Found, SearchBudget};
use super::device::Gpu;
use super::dnn::{
    blend, choose, descs, execute, math_of, set_math, workspace_of, Algo, Descs, Dir, Handle,
    DIRECTIONS, SEARCH_WORKSPACE,
};
use super::dnn_graph::{ConvGraph, ConvOp, EngineConfig, EnginePlan};
use super::CudaError;
use crate::cpu::conv::ConvShape;
use cudarc::cudnn::sys as dsys;
use std::rc::Rc;
use std::sync::atomic::AtomicBool;

/// What a plan chose for its three directions — the legacy algorithm and the math type it
/// wants, and where the search chose a backend engine instead, that engine — and the workspace
/// they need: kept so that another convolution of the same shape and precision takes the same
/// choice without measuring again ([`ConvPlan::from_choice`]).
#[derive(Clone, Debug)]
pub struct PlanChoice {
    algos: [Algo; 3],
    maths: [dsys::cudnnMathType_t; 3],
    pub engines: [Option<EngineConfig>; 3],
    pub workspace: usize,
}

impl PlanChoice {
    /// A choice from its parts: each direction's legacy algorithm, the math type its
    /// descriptor wants, the backend engine it runs instead where there is one (the probe's
    /// search, for the cache).
    pub(crate) fn new(
        algos: [Algo; 3],
        maths: [dsys::cudnnMathType_t; 3],
        engines: [Option<EngineConfig>; 3],
        workspace: usize,
    ) -> PlanChoice {
        PlanChoice {
            algos,
            maths,
            engines,
            workspace,
        }
    }

    /// The algorithms and math types as cuDNN numbers them (the cache file's form).
    pub fn codes(&self) -> ([u32; 3], [u32; 3]) {
        let a = |x: &Algo| match x {
            Algo::Fwd(a) => *a as u32,
            Algo::BwdData(a) => *a as u32,
            Algo::BwdFilter(a) => *a as u32,
        };
        (
            [a(&self.algos[0]), a(&self.algos[1]), a(&self.algos[2])],
            self.maths.map(|m| m as u32),
        )
    }

    /// From cuDNN's numbers (forward, backward-data, backward-filter); None for a number these
    /// bindings do not define (a cache written by another cuDNN).
    pub fn from_codes(algos: [u32; 3], maths: [u32; 3]) -> Option<PlanChoice> {
        use dsys::cudnnConvolutionBwdDataAlgo_t as D;
        use dsys::cudnnConvolutionBwdFilterAlgo_t as F;
        use dsys::cudnnConvolutionFwdAlgo_t as W;
        use dsys::cudnnMathType_t as M;
        let fwd = match algos[0] {
            0 => W::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM,
            1 => W::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM,
            2 => W::CUDNN_CONVOLUTION_FWD_ALGO_GEMM,
            3 => W::CUDNN_CONVOLUTION_FWD_ALGO_DIRECT,
            4 => W::CUDNN_CONVOLUTION_FWD_ALGO_FFT,
            5 => W::CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING,
            6 => W::CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD,
            7 => W::CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED,
            _ => return None,
        };
        let data = match algos[1] {
            0 => D::CUDNN_CONVOLUTION_BWD_DATA_ALGO_0,
            1 => D::CUDNN_CONVOLUTION_BWD_DATA_ALGO_1,
            2 => D::CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT,
            3 => D::CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING,
            4 => D::CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD,
            5 => D::CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED,
            _ => return None,
        };
        let filter = match algos[2] {
            0 => F::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0,
            1 => F::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1,
            2 => F::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT,
            3 => F::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3,
            4 => F::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD,
            5 => F::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED,
            6 => F::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING,
            _ => return None,
        };
        let math = |m: u32| match m {
            0 => Some(M::CUDNN_DEFAULT_MATH),
            1 => Some(M::CUDNN_TENSOR_OP_MATH),
            2 => Some(M::CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION),
            3 => Some(M::CUDNN_FMA_MATH),
            _ => None,
        };
        Some(PlanChoice {
            algos: [Algo::Fwd(fwd), Algo::BwdData(data), Algo::BwdFilter(filter)],
            maths: [math(maths[0])?, math(maths[1])?, math(maths[2])?],
            engines: [None, None, None],
            workspace: 0,
        })
    }

    /// This choice with `engines` where the search chose backend engines.
    pub fn with_engines(mut self, engines: [Option<EngineConfig>; 3]) -> PlanChoice {
        self.engines = engines;
        self
    }
}

/// The legacy algorithm a plan keeps for a direction, with its workspace: the search's measured
/// legacy choice, or where the search listed none, cuDNN's heuristic (which sets its math type
/// on `d`). The trainer's plans and the probe's cached choices take it alike.
pub(crate) fn legacy_of(
    h: &Handle,
    d: &Descs,
    p: Prec,
    dir: Dir,
    legacy: Option<Algo>,
) -> Result<(Algo, usize), CudaError> {
    match legacy {
        Some(a) => Ok((a, workspace_of(h, d, a)?)),
        None => choose(h, d, p, dir),
    }
}

/// One training convolution on cuDNN: NHWC activations, KRSC filters, f32 accumulation, in
/// `p`'s storage type (f32, or f16/bf16 for mixed precision; tf32 stores f32 and lets the
/// tensor cores round the inputs). Each direction has its own descriptors and a legacy
/// algorithm with the math type it wants; where the search chose a backend engine, the
/// direction runs that engine's plan (and backward-data's accumulating form, β = 1, its own
/// plan of the same engine, else the legacy algorithm).
pub struct ConvPlan {
    pub shape: ConvShape,
    pub prec: Prec,
    descs: [Descs; 3],
    algos: [Algo; 3],
    maths: [dsys::cudnnMathType_t; 3],
    engines: [Option<EnginePlan>; 3],
    add: Option<EnginePlan>,
    /// Workspace bytes each direction needs; the caller passes (address, bytes) of a device
    /// buffer at least this large.
    pub workspace: usize,
}

impl ConvPlan {
    /// The plan with each direction's algorithm from cuDNN's heuristic ([`choose`]).
    pub fn new(h: &Handle, shape: &ConvShape, p: Prec) -> Result<ConvPlan, CudaError> {
        ConvPlan::check_prec(p)?;
        ConvPlan::chosen(shape, p, |d, _, dir| {
            choose(h, d, p, dir).map(|(a, m)| (a, m, None))
        })
    }

    /// The plan with each direction's method chosen by the one search
    /// ([`best_method`](super::conv_search::best_method): the legacy API's measured algorithm
    /// and every backend engine, each timed on this GPU) on `scratch`: device buffers x, w, dy
    /// and an output as large as the largest of them, and the workspace `ws` (at
    /// most [`SEARCH_WORKSPACE`] is searched). The output buffer is overwritten. After each
    /// method's first run `check(dir)` says whether its output is right (the trainer's: f64
    /// sums of sampled entries, `probe::gpu::ConvOperands`): a method whose output is wrong at
    /// this shape is never chosen. Where the search lists no legacy algorithm, the heuristic's
    /// stands as the direction's legacy one. Each direction's search takes its share of
    /// `budget` and reports what it spent.
    #[allow(clippy::too_many_arguments)]
    pub fn measured(
        gpu: &Gpu,
        h: &Handle,
        shape: &ConvShape,
        p: Prec,
        [x, w, y, out]: [u64; 4],
        ws: (u64, usize),
        budget: &SearchBudget,
        check: &mut dyn FnMut(Dir) -> Result<(), String>,
    ) -> Result<ConvPlan, CudaError> {
        ConvPlan::check_prec(p)?;
        let ws = (ws.0, ws.1.min(SEARCH_WORKSPACE));
        let never = AtomicBool::new(false);
        let plan = ConvPlan::chosen(shape, p, |d, _, dir| {
            let operands = match dir {
                Dir::Fwd => [x, w, out],
                Dir::BwdData => [w, y, out],
                Dir::BwdFilter => [x, y, out],
            };
            let started = std::time::Instant::now();
            let share = budget.next();
            let found = best_method(
                gpu,
                h,
                d,
                shape,
                p,
                dir,
                operands,
                ws,
                &mut || check(dir),
                &never,
                share,
            );
            budget.spent(started.elapsed().as_secs_f64());
            let Found {
                searched, legacy, ..
            } = found?;
            let legacy = legacy_of(h, d, p, dir, legacy)?;
            match searched.best {
                Some((Chosen::Engine(e), _, _)) => {
                    Ok((legacy.0, legacy.1.max(e.workspace), Some(e)))
                }
                Some((Chosen::Legacy(a), _, _)) => Ok((a, workspace_of(h, d, a)?, None)),
                None => Err(CudaError::Unsupported(format!(
                    "no usable {} method for {shape:?}: {}",
                    dir.name(),
                    searched.summary()
                ))),
            }
        })?;
        plan.with_add(h)
    }

    /// A plan with an earlier choice for this shape and precision (this run's, or the cache
    /// file's), nothing measured; cuDNN is asked each algorithm's workspace, so that a choice it
    /// does not support here, or one needing more than [`SEARCH_WORKSPACE`], is an error (the
    /// caller measures instead).
    pub fn from_choice(
        h: &Handle,
        shape: &ConvShape,
        p: Prec,
        c: &PlanChoice,
    ) -> Result<ConvPlan, CudaError> {
        ConvPlan::check_prec(p)?;
        ConvPlan::chosen(shape, p, |d, i, _| {
            set_math(d, c.maths[i])?;
            let need = workspace_of(h, d, c.algos[i])?;
            if need > SEARCH_WORKSPACE {
                return Err(CudaError::Check(format!(
                    "a cached {} algorithm needs {need} bytes of workspace",
                    c.algos[i].name()
                )));
            }
            Ok((c.algos[i], need, None))
        })?
        .with_engines(h, c.engines.clone())
    }

    /// This plan with each direction's engine where `engines` names one (built on a graph of
    /// this shape; refused by cuDNN, or needing more than [`SEARCH_WORKSPACE`], is an error),
    /// and backward-data's accumulating plan.
    fn with_engines(
        mut self,
        h: &Handle,
        engines: [Option<EngineConfig>; 3],
    ) -> Result<ConvPlan, CudaError> {
        for (i, (dir, c)) in DIRECTIONS.into_iter().zip(engines).enumerate() {
            let Some(c) = c else { continue };
            let op = ConvOp::new(&self.shape, self.prec, dir, 0.0)?;
            let g = Rc::new(ConvGraph::new(h, op)?);
            let plan = EnginePlan::new(h, &g, &c)?;
            if plan.workspace > SEARCH_WORKSPACE {
                return Err(CudaError::Check(format!(
                    "a cached {} needs {} bytes of workspace",
                    c.name(),
                    plan.workspace
                )));
            }
            self.workspace = self.workspace.max(plan.workspace);
            self.engines[i] = Some(plan);
        }
        self.with_add(h)
    }

    /// Backward-data's accumulating form (dx += …) as its own plan of backward-data's engine,
    /// where it has one and cuDNN builds it; else it blends with the legacy algorithm.
    fn with_add(mut self, h: &Handle) -> Result<ConvPlan, CudaError> {
        self.add = None;
        if let Some(e) = &self.engines[1] {
            let add = ConvOp::new(&self.shape, self.prec, Dir::BwdData, 1.0)
                .and_then(|op| ConvGraph::new(h, op))
                .and_then(|g| EnginePlan::new(h, &Rc::new(g), &e.config));
            if let Ok(a) = add {
                if a.workspace <= SEARCH_WORKSPACE {
                    self.workspace = self.workspace.max(a.workspace);
                    self.add = Some(a);
                }
            }
        }
        Ok(self)
    }

    /// What this plan chose, for [`ConvPlan::from_choice`].
    pub fn choice(&self) -> PlanChoice {
        PlanChoice {
            algos: self.algos,
            maths: self.maths,
            engines: [0, 1, 2].map(|i| self.engines[i].as_ref().map(|e| e.config.clone())),
            workspace: self.workspace,
        }
    }

    fn check_prec(p: Prec) -> Result<(), CudaError> {
        if matches!(p, Prec::F32 | Prec::Tf32 | Prec::F16 | Prec::Bf16) {
            Ok(())
        } else {
            Err(CudaError::Unsupported(format!(
                "training convolutions in {}",
                p.name()
            )))
        }
    }

    /// Descriptors for each direction, `pick` choosing its algorithm (and setting the math
    /// type it wants on the descriptor).
    fn chosen(
        shape: &ConvShape,
        p: Prec,
        mut pick: impl FnMut(&Descs, usize, Dir) -> Result<(Algo, usize, Option<EnginePlan>), CudaError>,
    ) -> Result<ConvPlan, CudaError> {
        let descs = [descs(shape, p)?, descs(shape, p)?, descs(shape, p)?];
        let mut algos = Vec::with_capacity(3);
        let mut maths = [dsys::cudnnMathType_t::CUDNN_DEFAULT_MATH; 3];
        let mut engines: [Option<EnginePlan>; 3] = [None, None, None];
        let mut workspace = 0;
        for (i, dir) in DIRECTIONS.into_iter().enumerate() {
            let (a, m, engine) = pick(&descs[i], i, dir)?;
            algos.push(a);
            maths[i] = math_of(&descs[i])?;
            engines[i] = engine;
            workspace = workspace.max(m);
        }
        Ok(ConvPlan {
            shape: *shape,
            prec: p,
            descs,
            algos: [algos[0], algos[1], algos[2]],
            maths,
            engines,
            add: None,
            workspace,
        })
    }

    /// The methods, e.g. `fwd CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, bwd_data
    /// engine 12 {3=2}`.
    pub fn describe(&self) -> String {
        DIRECTIONS
            .iter()
            .zip(self.algos.iter().zip(&self.engines))
            .map(|(d, (a, e))| match e {
                Some(e) => format!("{} {}", d.name(), e.config.name()),
                None => format!("{} {}", d.name(), a.name()),
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// y = conv(x, w).
    pub fn forward(
        &self,
        h: &Handle,
        x: u64,
        w: u64,
        y: u64,
        ws: (u64, usize),
    ) -> Result<(), CudaError> {
        self.run(h, 0, [x, w, y], ws)
    }

    /// dx = ∂L/∂x from dy and w.
    pub fn backward_data(
        &self,
        h: &Handle,
        w: u64,
        dy: u64,
        dx: u64,
        ws: (u64, usize),
    ) -> Result<(), CudaError> {
        self.run(h, 1, [w, dy, dx], ws)
    }

    /// dx += ∂L/∂x from dy and w: the gradient added to what dx holds (a residual block's
    /// shortcut gradient), in one pass.
    pub fn backward_data_add(
        &self,
        h: &Handle,
        w: u64,
        dy: u64,
        dx: u64,
        ws: (u64, usize),
    ) -> Result<(), CudaError> {
        self.check_workspace(ws.1)?;
        match &self.add {
            Some(a) if aligned([w, dy, dx]) => a.execute(h, [w, dy, dx], ws),
            _ => blend(h, &self.descs[1], self.algos[1], [w, dy, dx], ws, 1.0),
        }
    }

    /// dw = ∂L/∂w from x and dy (overwritten, not accumulated).
    pub fn backward_filter(
        &self,
        h: &Handle,
        x: u64,
        dy: u64,
        dw: u64,
        ws: (u64, usize),
    ) -> Result<(), CudaError> {
        self.run(h, 2, [x, dy, dw], ws)
    }

    fn run(
        &self,
        h: &Handle,
        i: usize,
        operands: [u64; 3],
        ws: (u64, usize),
    ) -> Result<(), CudaError> {
        self.check_workspace(ws.1)?;
        match &self.engines[i] {
            Some(e) if aligned(operands) => e.execute(h, operands, ws),
            _ => execute(h, &self.descs[i], self.algos[i], operands, ws),
        }
    }

    fn check_workspace(&self, ws_bytes: usize) -> Result<(), CudaError> {
        if ws_bytes < self.workspace {
            return Err(CudaError::Check(format!(
                "cuDNN workspace of {ws_bytes} bytes, the plan needs {}",
                self.workspace
            )));
        }
        Ok(())
    }
}

/// Whether every operand is at the 16-byte alignment the backend graphs' tensors declare
/// (`dnn_graph`); an operand that is not (a view into a larger buffer) runs the direction's
/// legacy algorithm instead.
fn aligned(operands: [u64; 3]) -> bool {
    operands
        .iter()
        .all(|a| a % super::dnn_graph::ALIGNMENT == 0)
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_operand_off_the_declared_alignment_is_not_aligned() {
        assert!(super::aligned([0x1000, 0x2010, 0x30f0]));
        assert!(!super::aligned([0x1000, 0x2008, 0x3000]));
        assert!(!super::aligned([0x1002, 0x2000, 0x3000]));
    }
}
