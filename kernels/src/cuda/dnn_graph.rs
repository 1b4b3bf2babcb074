//! cuDNN's backend (graph) API for one convolution direction: the operation as a graph of one
//! node, every engine cuDNN offers for it ([`ConvGraph::engines`]: the heuristic's ranked
//! configurations, with their knobs, then every engine by its global index with default
//! knobs), and an engine's execution plan ([`EnginePlan`]). The legacy API
//! (`cudnnFind*AlgorithmEx`) reaches a subset of these engines; the search that chooses among
//! all of them is `cuda::conv_search`.
//!
//! Layering as cudarc's: the raw `sys` calls stay in this file, each status checked and named
//! in its error; descriptors are destroyed on drop. An engine is data ([`EngineConfig`]: its
//! global index and knob choices), so that a choice can be cached and rebuilt for another
//! graph of the same shape (the trainer's backward-data with β = 1).

use super::blas::Prec;
use super::dnn::{Dir, Handle};
use super::CudaError;
use crate::cpu::conv::ConvShape;
use cudarc::cudnn::sys as dsys;
use dsys::cudnnBackendAttributeName_t as A;
use dsys::cudnnBackendAttributeType_t as T;
use dsys::cudnnBackendDescriptorType_t as D;
use serde::{Deserialize, Serialize};
use std::ffi::c_void;
use std::rc::Rc;

/// One backend descriptor, destroyed on drop.
struct Bd(dsys::cudnnBackendDescriptor_t);

impl Drop for Bd {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: created by cudnnBackendCreateDescriptor, destroyed once.
            unsafe {
                let _ = dsys::cudnnBackendDestroyDescriptor(self.0);
            }
        }
    }
}

fn status(call: &str, s: dsys::cudnnStatus_t) -> Result<(), CudaError> {
    s.result().map_err(|e| CudaError::call(call, e))
}

impl Bd {
    fn new(kind: D) -> Result<Bd, CudaError> {
        let mut d = std::ptr::null_mut();
        // SAFETY: one out-parameter.
        status("cudnnBackendCreateDescriptor", unsafe {
            dsys::cudnnBackendCreateDescriptor(kind, &mut d)
        })?;
        Ok(Bd(d))
    }

    /// Sets `name` to the `n` elements of type `ty` at `v`.
    ///
    /// # Safety
    /// `v` points to `n` elements of the C type `ty` names.
    unsafe fn set_raw(&self, name: A, ty: T, n: usize, v: *const c_void) -> Result<(), CudaError> {
        status(&format!("cudnnBackendSetAttribute({name:?})"), unsafe {
            dsys::cudnnBackendSetAttribute(self.0, name, ty, n as i64, v)
        })
    }

    fn set_i64(&self, name: A, v: &[i64]) -> Result<(), CudaError> {
        // SAFETY: `v.len()` int64 elements.
        unsafe { self.set_raw(name, T::CUDNN_TYPE_INT64, v.len(), v.as_ptr().cast()) }
    }

    fn set_f64(&self, name: A, v: f64) -> Result<(), CudaError> {
        // SAFETY: one double.
        unsafe { self.set_raw(name, T::CUDNN_TYPE_DOUBLE, 1, (&v as *const f64).cast()) }
    }

    /// An enumeration attribute: its C value (a 32-bit enum) as cuDNN numbers it.
    fn set_enum(&self, name: A, ty: T, v: u32) -> Result<(), CudaError> {
        // SAFETY: one 32-bit enumeration value.
        unsafe { self.set_raw(name, ty, 1, (&v as *const u32).cast()) }
    }

    fn set_desc(&self, name: A, v: &[&Bd]) -> Result<(), CudaError> {
        let raw: Vec<dsys::cudnnBackendDescriptor_t> = v.iter().map(|d| d.0).collect();
        // SAFETY: `raw.len()` live descriptors.
        unsafe {
            self.set_raw(
                name,
                T::CUDNN_TYPE_BACKEND_DESCRIPTOR,
                raw.len(),
                raw.as_ptr().cast(),
            )
        }
    }

    fn set_handle(&self, name: A, h: &Handle) -> Result<(), CudaError> {
        let raw = h.raw();
        // SAFETY: one live handle.
        unsafe {
            self.set_raw(
                name,
                T::CUDNN_TYPE_HANDLE,
                1,
                (&raw as *const dsys::cudnnHandle_t).cast(),
            )
        }
    }

    fn finalize(&self, what: &str) -> Result<(), CudaError> {
        // SAFETY: a live descriptor.
        status(&format!("cudnnBackendFinalize({what})"), unsafe {
            dsys::cudnnBackendFinalize(self.0)
        })
    }

    /// Up to `out.len()` elements of `name`, of the C type `ty`; the count cuDNN wrote.
    ///
    /// # Safety
    /// `out` holds elements of the C type `ty` names.
    unsafe fn get_raw<E>(&self, name: A, ty: T, out: &mut [E]) -> Result<usize, CudaError> {
        let mut n = 0i64;
        status(&format!("cudnnBackendGetAttribute({name:?})"), unsafe {
            dsys::cudnnBackendGetAttribute(
                self.0,
                name,
                ty,
                out.len() as i64,
                &mut n,
                out.as_mut_ptr().cast(),
            )
        })?;
        Ok((n.max(0) as usize).min(out.len()))
    }

    fn get_i64(&self, name: A) -> Result<i64, CudaError> {
        let mut v = [0i64];
        // SAFETY: one int64.
        unsafe { self.get_raw(name, T::CUDNN_TYPE_INT64, &mut v) }?;
        Ok(v[0])
    }

    /// How many elements `name` holds (a request of none).
    fn count(&self, name: A, ty: T) -> Result<usize, CudaError> {
        let mut n = 0i64;
        // SAFETY: a request of zero elements writes only the count.
        status(
            &format!("cudnnBackendGetAttribute({name:?}, count)"),
            unsafe {
                dsys::cudnnBackendGetAttribute(self.0, name, ty, 0, &mut n, std::ptr::null_mut())
            },
        )?;
        Ok(n.max(0) as usize)
    }

    /// Descriptor-valued `name` read into `kind` descriptors created here (cuDNN fills
    /// descriptors the caller made), at most `max`.
    fn get_descs(&self, name: A, kind: D, max: usize) -> Result<Vec<Bd>, CudaError> {
        let n = self.count(name, T::CUDNN_TYPE_BACKEND_DESCRIPTOR)?.min(max);
        let made: Vec<Bd> = (0..n).map(|_| Bd::new(kind)).collect::<Result<_, _>>()?;
        let mut raw: Vec<dsys::cudnnBackendDescriptor_t> = made.iter().map(|d| d.0).collect();
        // SAFETY: `raw` holds live descriptors of the kind the attribute holds.
        let got = unsafe { self.get_raw(name, T::CUDNN_TYPE_BACKEND_DESCRIPTOR, &mut raw) }?;
        let mut made = made;
        made.truncate(got);
        Ok(made)
    }
}

fn data_type(p: Prec) -> u32 {
    (match p {
        Prec::F16 => dsys::cudnnDataType_t::CUDNN_DATA_HALF,
        Prec::Bf16 => dsys::cudnnDataType_t::CUDNN_DATA_BFLOAT16,
        _ => dsys::cudnnDataType_t::CUDNN_DATA_FLOAT,
    }) as u32
}

/// The byte alignment every graph's tensors declare: operands at another alignment run
/// elsewhere (`dnn_plan`).
pub const ALIGNMENT: u64 = 16;

/// The unique ids of x, w and y in every graph and variant pack.
const UID_X: i64 = 1;
const UID_W: i64 = 2;
const UID_Y: i64 = 3;

/// A direction's operands as `dnn::execute` orders them (`[x, w, y]`, `[w, dy, dx]`,
/// `[x, dy, dw]`) named by their tensors' ids.
pub(crate) fn uids(dir: Dir) -> [i64; 3] {
    match dir {
        Dir::Fwd => [UID_X, UID_W, UID_Y],
        Dir::BwdData => [UID_W, UID_Y, UID_X],
        Dir::BwdFilter => [UID_X, UID_Y, UID_W],
    }
}

/// A 4-d NHWC tensor (dimensions in cuDNN's n, c, h, w order, strides of channels-last).
fn tensor(uid: i64, p: Prec, [n, c, h, w]: [usize; 4]) -> Result<Bd, CudaError> {
    let t = Bd::new(D::CUDNN_BACKEND_TENSOR_DESCRIPTOR)?;
    t.set_enum(
        A::CUDNN_ATTR_TENSOR_DATA_TYPE,
        T::CUDNN_TYPE_DATA_TYPE,
        data_type(p),
    )?;
    let d = [n, c, h, w].map(|v| v as i64);
    t.set_i64(A::CUDNN_ATTR_TENSOR_DIMENSIONS, &d)?;
    t.set_i64(
        A::CUDNN_ATTR_TENSOR_STRIDES,
        &[d[1] * d[2] * d[3], 1, d[3] * d[1], d[1]],
    )?;
    t.set_i64(A::CUDNN_ATTR_TENSOR_UNIQUE_ID, &[uid])?;
    t.set_i64(A::CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, &[ALIGNMENT as i64])?;
    t.finalize("tensor")?;
    Ok(t)
}

/// One convolution direction as a backend operation, needing no handle and no GPU (the library
/// gate builds every one): its tensors, the convolution (cross-correlation, f32 compute) and
/// the operation, out = α·op + β·out with α = 1.
pub struct ConvOp {
    pub dir: Dir,
    op: Bd,
    // Kept alive as long as the operation that refers to them.
    _parts: [Bd; 4],
}

impl ConvOp {
    pub fn new(s: &ConvShape, p: Prec, dir: Dir, beta: f64) -> Result<ConvOp, CudaError> {
        super::libs::require(super::libs::Lib::Cudnn)?;
        if [s.n, s.c, s.k, s.r, s.s].contains(&0) {
            return Err(CudaError::Check(format!(
                "a convolution of {} images, {} to {} channels, {}×{} filters: no dimension may be 0",
                s.n, s.c, s.k, s.r, s.s
            )));
        }
        if s.stride == 0 || s.h + 2 * s.pad < s.r || s.w + 2 * s.pad < s.s {
            return Err(CudaError::Check(format!(
                "a {}×{} filter (stride {}, padding {}) does not fit a {}×{} input",
                s.r, s.s, s.stride, s.pad, s.h, s.w
            )));
        }
        let x = tensor(UID_X, p, [s.n, s.c, s.h, s.w])?;
        let w = tensor(UID_W, p, [s.k, s.c, s.r, s.s])?;
        let y = tensor(UID_Y, p, [s.n, s.k, s.oh(), s.ow()])?;
        let conv = Bd::new(D::CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR)?;
        conv.set_enum(
            A::CUDNN_ATTR_CONVOLUTION_COMP_TYPE,
            T::CUDNN_TYPE_DATA_TYPE,
            dsys::cudnnDataType_t::CUDNN_DATA_FLOAT as u32,
        )?;
        conv.set_enum(
            A::CUDNN_ATTR_CONVOLUTION_CONV_MODE,
            T::CUDNN_TYPE_CONVOLUTION_MODE,
            dsys::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION as u32,
        )?;
        conv.set_i64(A::CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, &[2])?;
        conv.set_i64(A::CUDNN_ATTR_CONVOLUTION_DILATIONS, &[1, 1])?;
        let (st, pad) = (s.stride as i64, s.pad as i64);
        conv.set_i64(A::CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, &[st, st])?;
        conv.set_i64(A::CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, &[pad, pad])?;
        conv.set_i64(A::CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, &[pad, pad])?;
        conv.finalize("convolution")?;
        let (kind, alpha, beta_name, conv_name, names) = match dir {
            Dir::Fwd => (
                D::CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA,
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
                [
                    A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
                    A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
                    A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
                ],
            ),
            Dir::BwdData => (
                D::CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA,
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
                [
                    A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
                    A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
                    A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY,
                ],
            ),
            Dir::BwdFilter => (
                D::CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA,
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
                [
                    A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
                    A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
                    A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY,
                ],
            ),
        };
        let op = Bd::new(kind)?;
        op.set_f64(alpha, 1.0)?;
        op.set_f64(beta_name, beta)?;
        op.set_desc(conv_name, &[&conv])?;
        // x (or dx), w (or dw), y (or dy), each attribute named for its direction.
        op.set_desc(names[0], &[&x])?;
        op.set_desc(names[1], &[&w])?;
        op.set_desc(names[2], &[&y])?;
        op.finalize(&format!("{} operation", dir.name()))?;
        Ok(ConvOp {
            dir,
            op,
            _parts: [x, w, y, conv],
        })
    }
}

/// One engine with its knob choices: cuDNN's global index of the engine for this graph and
/// (knob type, value) pairs, the types as cuDNN numbers `cudnnBackendKnobType_t`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct EngineConfig {
    pub index: i64,
    pub knobs: Vec<(u32, i64)>,
}

impl EngineConfig {
    /// `engine 12` or `engine 12 {3=2, 5=1}`.
    pub fn name(&self) -> String {
        if self.knobs.is_empty() {
            format!("engine {}", self.index)
        } else {
            let k: Vec<String> = self.knobs.iter().map(|(t, v)| format!("{t}={v}")).collect();
            format!("engine {} {{{}}}", self.index, k.join(", "))
        }
    }
}

/// What cuDNN says of an engine's numerics and behaviour, as far as the search cares.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Notes {
    pub tensor_core: bool,
    pub down_converts: bool,
    pub reduced_reduction: bool,
    pub runtime_compiled: bool,
}

impl Notes {
    /// Why an engine may not stand for precision `p`, if it may not: plain f32 keeps FMA
    /// math (no TF32 tensor cores), and no precision takes a down-conversion of its inputs or
    /// a reduction in less than f32 (the probe and the trainer accumulate in f32).
    pub fn excludes(&self, p: Prec) -> Option<&'static str> {
        if p == Prec::F32 && self.tensor_core {
            Some("tensor-core (TF32) math in an f32 convolution")
        } else if self.down_converts {
            Some("down-converts its inputs")
        } else if self.reduced_reduction {
            Some("reduces in less than f32")
        } else {
            None
        }
    }
}

/// One direction's operation as a graph bound to a handle.
pub struct ConvGraph {
    pub op: ConvOp,
    graph: Bd,
}

/// The most engine configurations taken from one heuristic query, and knobs read per engine.
const MAX_HEURISTIC: usize = 64;
const MAX_KNOBS: usize = 64;

impl ConvGraph {
    pub fn new(h: &Handle, op: ConvOp) -> Result<ConvGraph, CudaError> {
        let graph = Bd::new(D::CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR)?;
        graph.set_handle(A::CUDNN_ATTR_OPERATIONGRAPH_HANDLE, h)?;
        graph.set_desc(A::CUDNN_ATTR_OPERATIONGRAPH_OPS, &[&op.op])?;
        graph.finalize("operation graph")?;
        Ok(ConvGraph { op, graph })
    }

    /// Every engine cuDNN offers for this graph, each once: the heuristic's configurations
    /// first, in its rank order (mode A; the first is its choice), then every engine by global
    /// index with its default knobs. A heuristic that fails leaves the global list, with the
    /// error for the caller to note.
    pub fn engines(&self) -> Result<(Vec<EngineConfig>, Option<CudaError>), CudaError> {
        let mut out: Vec<EngineConfig> = Vec::new();
        let heuristic = self.heuristic();
        let note = match heuristic {
            Ok(list) => {
                out.extend(list);
                None
            }
            Err(e) => Some(e),
        };
        let count = self
            .graph
            .get_i64(A::CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT)?;
        for index in 0..count.max(0) {
            let c = EngineConfig {
                index,
                knobs: Vec::new(),
            };
            if !out.contains(&c) {
                out.push(c);
            }
        }
        Ok((out, note))
    }

    /// The heuristic's (mode A) ranked configurations.
    fn heuristic(&self) -> Result<Vec<EngineConfig>, CudaError> {
        let heur = Bd::new(D::CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR)?;
        heur.set_desc(A::CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, &[&self.graph])?;
        heur.set_enum(
            A::CUDNN_ATTR_ENGINEHEUR_MODE,
            T::CUDNN_TYPE_HEUR_MODE,
            dsys::cudnnBackendHeurMode_t::CUDNN_HEUR_MODE_A as u32,
        )?;
        heur.finalize("engine heuristic")?;
        let cfgs = heur.get_descs(
            A::CUDNN_ATTR_ENGINEHEUR_RESULTS,
            D::CUDNN_BACKEND_ENGINECFG_DESCRIPTOR,
            MAX_HEURISTIC,
        )?;
        let mut out = Vec::with_capacity(cfgs.len());
        for cfg in &cfgs {
            let engine = cfg.get_descs(
                A::CUDNN_ATTR_ENGINECFG_ENGINE,
                D::CUDNN_BACKEND_ENGINE_DESCRIPTOR,
                1,
            )?;
            let Some(engine) = engine.first() else {
                continue;
            };
            let index = engine.get_i64(A::CUDNN_ATTR_ENGINE_GLOBAL_INDEX)?;
            let choices = cfg.get_descs(
                A::CUDNN_ATTR_ENGINECFG_KNOB_CHOICES,
                D::CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR,
                MAX_KNOBS,
            )?;
            let mut knobs = Vec::with_capacity(choices.len());
            for k in &choices {
                let mut ty = [0u32];
                // SAFETY: one 32-bit knob type.
                unsafe {
                    k.get_raw(
                        A::CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE,
                        T::CUDNN_TYPE_KNOB_TYPE,
                        &mut ty,
                    )
                }?;
                knobs.push((ty[0], k.get_i64(A::CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE)?));
            }
            let c = EngineConfig { index, knobs };
            if !out.contains(&c) {
                out.push(c);
            }
        }
        Ok(out)
    }

    /// What cuDNN notes of engine `c` on this graph (an error where it does not support it).
    pub fn notes(&self, c: &EngineConfig) -> Result<Notes, CudaError> {
        self.engine(c).map(|(_, n)| n)
    }

    /// The engine `c` on this graph, with what cuDNN notes of it; an error where the engine
    /// does not support the graph (`CUDNN_STATUS_NOT_SUPPORTED` at its finalisation).
    fn engine(&self, c: &EngineConfig) -> Result<(Bd, Notes), CudaError> {
        let e = Bd::new(D::CUDNN_BACKEND_ENGINE_DESCRIPTOR)?;
        e.set_desc(A::CUDNN_ATTR_ENGINE_OPERATION_GRAPH, &[&self.graph])?;
        e.set_i64(A::CUDNN_ATTR_ENGINE_GLOBAL_INDEX, &[c.index])?;
        e.finalize("engine")?;
        let mut notes = Notes::default();
        let mut num = [0u32; 16];
        // SAFETY: 32-bit numerical-note values.
        let n = unsafe {
            e.get_raw(
                A::CUDNN_ATTR_ENGINE_NUMERICAL_NOTE,
                T::CUDNN_TYPE_NUMERICAL_NOTE,
                &mut num,
            )
        }?;
        use dsys::cudnnBackendNumericalNote_t as N;
        for &v in &num[..n] {
            notes.tensor_core |= v == N::CUDNN_NUMERICAL_NOTE_TENSOR_CORE as u32;
            notes.down_converts |= v == N::CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS as u32;
            notes.reduced_reduction |=
                v == N::CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION as u32;
        }
        let mut beh = [0u32; 16];
        // SAFETY: 32-bit behaviour-note values.
        let n = unsafe {
            e.get_raw(
                A::CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE,
                T::CUDNN_TYPE_BEHAVIOR_NOTE,
                &mut beh,
            )
        }?;
        notes.runtime_compiled = beh[..n].contains(
            &(dsys::cudnnBackendBehaviorNote_t::CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION as u32),
        );
        Ok((e, notes))
    }
}

/// An engine configuration made into an execution plan for one graph: run it with
/// [`EnginePlan::execute`].
pub struct EnginePlan {
    pub config: EngineConfig,
    pub notes: Notes,
    /// Workspace bytes the plan needs.
    pub workspace: usize,
    dir: Dir,
    plan: Bd,
    // What the plan was made from, alive as long as it (cuDNN's descriptors refer to the
    // descriptors set on them).
    _made_from: (Rc<ConvGraph>, Bd, Bd, Vec<Bd>),
}

impl EnginePlan {
    /// The plan of `c` on `g`; an error where cuDNN refuses the engine or its knobs here.
    pub fn new(h: &Handle, g: &Rc<ConvGraph>, c: &EngineConfig) -> Result<EnginePlan, CudaError> {
        let (engine, notes) = g.engine(c)?;
        let cfg = Bd::new(D::CUDNN_BACKEND_ENGINECFG_DESCRIPTOR)?;
        cfg.set_desc(A::CUDNN_ATTR_ENGINECFG_ENGINE, &[&engine])?;
        let mut choices = Vec::with_capacity(c.knobs.len());
        for &(ty, v) in &c.knobs {
            let k = Bd::new(D::CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR)?;
            k.set_enum(
                A::CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE,
                T::CUDNN_TYPE_KNOB_TYPE,
                ty,
            )?;
            k.set_i64(A::CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, &[v])?;
            k.finalize("knob choice")?;
            choices.push(k);
        }
        if !choices.is_empty() {
            let refs: Vec<&Bd> = choices.iter().collect();
            cfg.set_desc(A::CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, &refs)?;
        }
        cfg.finalize("engine configuration")?;
        let plan = Bd::new(D::CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR)?;
        plan.set_handle(A::CUDNN_ATTR_EXECUTION_PLAN_HANDLE, h)?;
        plan.set_desc(A::CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, &[&cfg])?;
        plan.finalize("execution plan")?;
        let workspace = plan
            .get_i64(A::CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE)?
            .max(0) as usize;
        Ok(EnginePlan {
            config: c.clone(),
            notes,
            workspace,
            dir: g.op.dir,
            plan,
            _made_from: (g.clone(), engine, cfg, choices),
        })
    }

    /// Runs the plan on `operands` (device addresses in `dnn::execute`'s order for the
    /// direction), with the workspace `(address, bytes)`.
    pub fn execute(
        &self,
        h: &Handle,
        operands: [u64; 3],
        (ws_ptr, ws_bytes): (u64, usize),
    ) -> Result<(), CudaError> {
        if ws_bytes < self.workspace {
            return Err(CudaError::Check(format!(
                "cuDNN workspace of {ws_bytes} bytes, {} needs {}",
                self.config.name(),
                self.workspace
            )));
        }
        let vp = Bd::new(D::CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR)?;
        vp.set_i64(A::CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, &uids(self.dir))?;
        let ptrs: [*mut c_void; 3] = operands.map(|a| a as *mut c_void);
        let ws = ws_ptr as *mut c_void;
        // SAFETY: three device pointers, then one; the caller's buffers hold the tensors the
        // graph describes and the workspace at least the plan's.
        unsafe {
            vp.set_raw(
                A::CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
                T::CUDNN_TYPE_VOID_PTR,
                3,
                ptrs.as_ptr().cast(),
            )?;
            vp.set_raw(
                A::CUDNN_ATTR_VARIANT_PACK_WORKSPACE,
                T::CUDNN_TYPE_VOID_PTR,
                1,
                (&ws as *const *mut c_void).cast(),
            )?;
        }
        vp.finalize("variant pack")?;
        // SAFETY: live handle, plan and variant pack.
        status("cudnnBackendExecute", unsafe {
            dsys::cudnnBackendExecute(h.raw(), self.plan.0, vp.0)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_direction_names_its_three_tensors_once() {
        for dir in super::super::dnn::DIRECTIONS {
            let mut u = uids(dir);
            u.sort();
            assert_eq!(u, [UID_X, UID_W, UID_Y], "{}", dir.name());
        }
        // Backward-data writes dx (x's id) from w and dy (y's id).
        assert_eq!(uids(Dir::BwdData), [UID_W, UID_Y, UID_X]);
        assert_eq!(uids(Dir::BwdFilter), [UID_X, UID_Y, UID_W]);
    }

    #[test]
    fn f32_keeps_fma_math_and_no_precision_down_converts() {
        let tc = Notes {
            tensor_core: true,
            ..Notes::default()
        };
        assert!(tc.excludes(Prec::F32).is_some());
        for p in [Prec::Tf32, Prec::F16, Prec::Bf16] {
            assert_eq!(tc.excludes(p), None, "{}", p.name());
        }
        let dc = Notes {
            down_converts: true,
            ..Notes::default()
        };
        let rr = Notes {
            reduced_reduction: true,
            ..Notes::default()
        };
        for p in [Prec::F32, Prec::Tf32, Prec::F16, Prec::Bf16] {
            assert!(dc.excludes(p).is_some() && rr.excludes(p).is_some());
            assert_eq!(Notes::default().excludes(p), None);
        }
    }

    #[test]
    fn an_engine_is_named_with_its_knobs() {
        let c = EngineConfig {
            index: 12,
            knobs: vec![(3, 2), (5, 1)],
        };
        assert_eq!(c.name(), "engine 12 {3=2, 5=1}");
        assert_eq!(
            EngineConfig {
                index: 0,
                knobs: vec![]
            }
            .name(),
            "engine 0"
        );
    }
}
