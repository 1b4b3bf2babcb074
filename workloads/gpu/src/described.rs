//! A described network on the GPU ([`GpuGraph`], the twin of [`roofline_models::graph::Graph`]): AutoML's
//! candidates trained by the CUDA trainer. It walks the description node by node over the GPU
//! layers the ResNet's body is made of (`GConv` on cuDNN, `GBn`, the pooling kernels, `GLinear`
//! on cuBLAS), with the ResNet classifier's flat store, loss, loss scale, bucketed NCCL
//! exchange and SGD ([`update`], [`conclude`], `classify.rs`).
//!
//! Values live on the device in the run's storage (16 bits in f16 and bf16), as the ResNet's
//! activations do, except the global average pool's and the dense layers' (f32: the classifier
//! runs on cuBLAS in f32); a layer reading a value in another storage reads a cast copy, and
//! the gradient it sends back is cast to the value's storage. Every value of a training pass is
//! kept until its backward pass, where each node's gradient is the sum of what its readers sent
//! (as `Graph::backward_with`); the flat store is laid out in the nodes' order, so what the
//! backward pass has finished is always a suffix of it, as the exchange's buckets want.

use super::*;
use roofline_kernels::cuda::stage::Stager;
use roofline_models::graph::{Graph, Layer};
use roofline_models::train::Model;

/// A node's GPU layer.
enum GNode {
    Conv(GConv),
    BatchNorm {
        bn: Box<GBn>,
        relu: bool,
    },
    Relu,
    /// Each output's winning tap from the forward pass, and the input's (n, h, w, c).
    MaxPool {
        taps: Option<Buf>,
        input: (usize, usize, usize, usize),
    },
    Add,
    /// The input's rows and columns.
    GlobalAvgPool {
        input: (usize, usize),
    },
    /// The f32 input of the forward pass (the weights' gradient reads it).
    Dense {
        fc: GLinear,
        input: Option<Rc<GTensor>>,
    },
}

/// A node: the values it reads, its layer, its parameters' slots.
struct Node {
    inputs: Vec<usize>,
    layer: GNode,
    slots: Vec<Slot>,
    span: String,
}

/// A described network on the GPU, built from (and written back into) the CPU graph.
pub struct GpuGraph {
    flat: Flat,
    nodes: Vec<Node>,
    /// The values of the last training forward pass (value 0 the input).
    values: Vec<Rc<GTensor>>,
    classes: usize,
    /// How values and their gradients are stored: in the convolutions' 16 bits in f16 and
    /// bf16, else f32.
    pub store: Storage,
    stager: Arc<Stager>,
    pub loss_scale: LossScale,
    /// Steps skipped because the scaled gradients overflowed.
    pub skipped: usize,
    pub(super) sync: Option<GradSync>,
    /// Declared last: dropped after every buffer above has been freed on its stream.
    pub ctx: Ctx,
}

/// A view of `t`'s buffer (`t`, or what owns it, outlives the view's use).
fn view(t: &GTensor) -> GTensor {
    GTensor {
        buf: t.buf.alias(),
        ..*t
    }
}

/// `t` itself when it is stored as `dt`, else a cast copy.
fn stored(ctx: &mut Ctx, t: &Rc<GTensor>, dt: Storage) -> Result<Rc<GTensor>, CudaError> {
    if t.dt == dt {
        return Ok(Rc::clone(t));
    }
    let out = ctx.tensor_in(dt, t.n, t.h, t.w, t.c)?;
    ctx.cast_between(t.dt, dt, t.ptr(), out.ptr(), t.len())?;
    Ok(Rc::new(out))
}

/// A copy of `t` (same storage), in stream order.
fn copied(ctx: &Ctx, t: &GTensor) -> Result<GTensor, CudaError> {
    let out = ctx.tensor_like(t, t.n, t.h, t.w, t.c)?;
    // SAFETY: both hold t's elements of t's storage, in two buffers.
    unsafe {
        ctx.gpu
            .copy_on_device(out.ptr(), t.ptr(), t.len() * t.dt.bytes())?
    };
    Ok(out)
}

/// Every value's channels (value 0 the input), from the layers alone.
fn channels(model: &Graph<f32>) -> Vec<usize> {
    let mut c = vec![model.description.channels];
    for n in &model.description.nodes {
        let next = match n.op {
            roofline_models::graph::Op::Conv { channels, .. } => channels,
            roofline_models::graph::Op::Dense { outputs } => outputs,
            _ => c[n.inputs[0]],
        };
        c.push(next);
    }
    c
}

impl GpuGraph {
    /// Uploads `model` (parameters, running statistics) to `ctx`'s GPU. With `nccl`, gradients
    /// are summed over its ranks; `reducer` (the same ranks) sums the batch-norm statistics.
    pub fn new(
        ctx: Ctx,
        model: &mut Graph<f32>,
        nccl: Option<Communicator>,
        reducer: Option<Arc<dyn Reducer>>,
        comm: CommOptions,
    ) -> Result<GpuGraph, CudaError> {
        let mut convs = HashMap::new();
        for l in model.layers() {
            if let Layer::Conv(c) = l {
                convs.insert(c.weight.name.clone(), (c.shape.depth(), c.shape.k));
            }
        }
        let flat = flat_params(&ctx, &Model::params(model), &convs)?;
        let mut it = flat.slots.clone().into_iter();
        let mut next = || {
            it.next()
                .ok_or_else(|| CudaError::Check("parameter list".into()))
        };
        let classes = *channels(model).last().unwrap_or(&0);
        let mut nodes = Vec::with_capacity(model.layers().len());
        for (i, (node, layer)) in model
            .description
            .nodes
            .iter()
            .zip(model.layers())
            .enumerate()
        {
            let span = format!("node{i}");
            let (layer, slots) = match layer {
                Layer::Conv(c) => {
                    let w = next()?;
                    let mut g = GConv::new(c, w);
                    g.span = Some(span.clone());
                    (GNode::Conv(g), vec![w])
                }
                Layer::BatchNorm { bn, relu } => {
                    let (gamma, beta) = (next()?, next()?);
                    let mut g = GBn::new(bn, gamma, beta, reducer.clone());
                    g.span = Some(span.clone());
                    let relu = *relu;
                    (
                        GNode::BatchNorm {
                            bn: Box::new(g),
                            relu,
                        },
                        vec![gamma, beta],
                    )
                }
                Layer::Relu => (GNode::Relu, Vec::new()),
                Layer::MaxPool(_) => (
                    GNode::MaxPool {
                        taps: None,
                        input: (0, 0, 0, 0),
                    },
                    Vec::new(),
                ),
                Layer::Add => (GNode::Add, Vec::new()),
                Layer::GlobalAvgPool => (GNode::GlobalAvgPool { input: (0, 0) }, Vec::new()),
                Layer::Dense(d) => {
                    let (w, b) = (next()?, next()?);
                    let fc = GLinear {
                        w,
                        b,
                        inputs: d.inputs,
                        outputs: d.outputs,
                    };
                    (GNode::Dense { fc, input: None }, vec![w, b])
                }
            };
            nodes.push(Node {
                inputs: node.inputs.clone(),
                layer,
                slots,
                span,
            });
        }
        if next().is_ok() {
            return Err(CudaError::Check(
                "the graph has parameters that no layer takes".into(),
            ));
        }
        let (sync, loss_scale) = GradSync::with_scale(&ctx, nccl, comm, flat.total)?;
        if let Some(g) = &sync {
            let comm = Rc::new(bn_communicator(&ctx, g, reducer.as_deref())?);
            for n in &mut nodes {
                if let GNode::BatchNorm { bn, .. } = &mut n.layer {
                    bn.sum_on_device(Rc::clone(&comm));
                }
            }
        }
        let store = Storage::of(ctx.prec);
        let stager = Arc::new(Stager::new(&ctx.gpu, store)?);
        Ok(GpuGraph {
            flat,
            nodes,
            values: Vec::new(),
            classes,
            store,
            stager,
            loss_scale,
            skipped: 0,
            sync,
            ctx,
        })
    }

    /// The logits (rows × classes, f32) of an NHWC batch on the device; a training pass keeps
    /// every value for the backward pass.
    fn forward(&mut self, x: GTensor, train: bool) -> Result<GTensor, CudaError> {
        let store = self.store;
        let ctx = &mut self.ctx;
        let flat = &self.flat;
        let mut values: Vec<Rc<GTensor>> = vec![Rc::new(x)];
        for node in &mut self.nodes {
            let a = Rc::clone(&values[node.inputs[0]]);
            let span = &node.span;
            // The layers with a span of their own (convolutions, batch norms) time themselves.
            let t0 = match node.layer {
                GNode::Conv(_) | GNode::BatchNorm { .. } => None,
                _ => ctx.mark()?,
            };
            let y = match &mut node.layer {
                GNode::Conv(c) => {
                    let a = stored(ctx, &a, store)?;
                    c.forward(ctx, flat, &a, train)?
                }
                GNode::BatchNorm { bn, relu } => {
                    // Batch norm keeps its input for the backward pass: a view of the value
                    // (kept in `values`), or the cast copy itself.
                    let a = match Rc::try_unwrap(stored(ctx, &a, store)?) {
                        Ok(own) => own,
                        Err(shared) => view(&shared),
                    };
                    bn.forward(ctx, flat, a, train, *relu)?
                }
                GNode::Relu => {
                    let a = stored(ctx, &a, store)?;
                    // relu(a): a's copy with every element zeroed where a is not positive.
                    let y = copied(ctx, &a)?;
                    elementwise(ctx, RELU_MASK, &a, &y)?;
                    y
                }
                GNode::MaxPool { taps, input } => {
                    let a = stored(ctx, &a, store)?;
                    let (oh, ow) = (pool_out(a.h), pool_out(a.w));
                    let p = ctx.tensor_like(&a, a.n, oh, ow, a.c)?;
                    let tap = ctx.alloc(p.len())?;
                    let dims = [a.n, a.h, a.w, a.c, oh, ow];
                    // SAFETY: a holds n·h·w·c, p n·oh·ow·c values of a's storage; tap
                    // n·oh·ow·c bytes.
                    unsafe {
                        pool_launch(
                            ctx,
                            a.kernel(MAXPOOL_FORWARD),
                            p.len(),
                            [a.ptr(), p.ptr(), tap.ptr],
                            dims,
                        )?
                    };
                    if train {
                        *taps = Some(tap);
                        *input = (a.n, a.h, a.w, a.c);
                    }
                    p
                }
                GNode::Add => {
                    let a = stored(ctx, &a, store)?;
                    let b = stored(ctx, &values[node.inputs[1]], store)?;
                    let y = copied(ctx, &a)?;
                    elementwise(ctx, ADD_INTO, &y, &b)?;
                    y
                }
                GNode::GlobalAvgPool { input } => {
                    let a = stored(ctx, &a, store)?;
                    let pooled = ctx.tensor(a.n, 1, 1, a.c)?;
                    let (ap, op) = (a.ptr(), pooled.ptr());
                    let (n, hw, c) = (a.n as i32, (a.h * a.w) as i32, a.c as i32);
                    // SAFETY: a holds n·hw·c values of its storage, pooled n·c f32.
                    unsafe {
                        ctx.launch(
                            a.kernel(AVGPOOL_FORWARD),
                            a.n * a.c,
                            &mut [arg(&ap), arg(&op), arg(&n), arg(&hw), arg(&c)],
                        )?
                    };
                    *input = (a.h, a.w);
                    pooled
                }
                GNode::Dense { fc, input } => {
                    let a = stored(ctx, &a, Storage::F32)?;
                    if (a.h, a.w) != (1, 1) {
                        return Err(CudaError::Check(format!(
                            "{span}: a dense layer on a {}×{} input (1×1 needed)",
                            a.h, a.w
                        )));
                    }
                    let y = fc.forward(ctx, flat, &a)?;
                    if train {
                        *input = Some(a);
                    }
                    y
                }
            };
            ctx.close(FWD, || span.clone(), t0)?;
            values.push(Rc::new(y));
        }
        let last = values
            .last()
            .map(Rc::clone)
            .ok_or_else(|| CudaError::Check("the network has no layers".into()))?;
        let logits = stored(ctx, &last, Storage::F32)?;
        let logits = match Rc::try_unwrap(logits) {
            Ok(own) => own,
            Err(shared) => copied(ctx, &shared)?,
        };
        if train {
            self.values = values;
        }
        Ok(logits)
    }

    /// Every parameter's gradient from ∂loss/∂logits (f32) after a training forward pass, node
    /// by node from the last; `sync` is told after each node which gradients are final.
    fn backward(&mut self, dlogits: GTensor) -> Result<(), CudaError> {
        let missing = || CudaError::Check("backward before a training forward pass".into());
        let values = std::mem::take(&mut self.values);
        let n = self.nodes.len();
        if values.len() != n + 1 {
            return Err(missing());
        }
        let ctx = &mut self.ctx;
        let flat = &self.flat;
        let mut sync = self.sync.as_mut();
        if let Some(g) = sync.as_deref_mut() {
            g.begin(flat.total);
        }
        let mut grads: Vec<Option<GTensor>> = (0..=n).map(|_| None).collect();
        grads[n] = Some(dlogits);
        for i in (0..n).rev() {
            let node = &mut self.nodes[i];
            let input = node.inputs[0];
            let Some(dy) = grads[i + 1].take() else {
                // Nothing downstream reads this value: its parameters' gradients are zero.
                for s in &node.slots {
                    ctx.zero(flat.grad(*s), 4 * s.len)?;
                }
                finished(ctx, flat, sync.as_deref_mut(), &node.slots)?;
                continue;
            };
            let dy = as_stored(ctx, dy, values[i + 1].dt)?;
            let span = &node.span;
            let t0 = match node.layer {
                GNode::Conv(_) | GNode::BatchNorm { .. } => None,
                _ => ctx.mark()?,
            };
            // The gradients for the node's inputs (the second an Add's).
            let (dx, second): (Option<GTensor>, Option<GTensor>) = match &mut node.layer {
                // The image needs no gradient.
                GNode::Conv(c) => (c.backward(ctx, flat, &dy, input != 0)?, None),
                GNode::BatchNorm { bn, relu } => {
                    let out = relu.then(|| &*values[i + 1]);
                    (Some(bn.backward(ctx, flat, &dy, out)?), None)
                }
                GNode::Relu => {
                    // The mask in place: dy is this node's own.
                    elementwise(ctx, RELU_MASK, &values[i + 1], &dy)?;
                    (Some(dy), None)
                }
                GNode::MaxPool {
                    taps,
                    input: (pn, ph, pw, pc),
                } => {
                    let tap = taps.take().ok_or_else(missing)?;
                    let ds = ctx.tensor_like(&dy, *pn, *ph, *pw, *pc)?;
                    let dims = [*pn, *ph, *pw, *pc, dy.h, dy.w];
                    // SAFETY: dy and tap hold n·oh·ow·c values (of dy's storage; bytes), ds
                    // n·h·w·c.
                    unsafe {
                        pool_launch(
                            ctx,
                            dy.kernel(MAXPOOL_BACKWARD),
                            ds.len(),
                            [dy.ptr(), tap.ptr, ds.ptr()],
                            dims,
                        )?
                    };
                    (Some(ds), None)
                }
                GNode::Add => {
                    let other = copied(ctx, &dy)?;
                    (Some(dy), Some(other))
                }
                GNode::GlobalAvgPool { input: (h, w) } => {
                    let dx = ctx.tensor_in(self.store, dy.n, *h, *w, dy.c)?;
                    let (dyp, dxp) = (dy.ptr(), dx.ptr());
                    let (rows, hw, c) = (dy.n as i32, (*h * *w) as i32, dy.c as i32);
                    // SAFETY: dy holds n × c f32, dx n × hw × c values of its storage.
                    unsafe {
                        ctx.launch(
                            dx.kernel(AVGPOOL_BACKWARD),
                            dx.len(),
                            &mut [arg(&dyp), arg(&dxp), arg(&rows), arg(&hw), arg(&c)],
                        )?
                    };
                    (Some(dx), None)
                }
                GNode::Dense { fc, input: x } => {
                    let x = x.take().ok_or_else(missing)?;
                    fc.backward_params(ctx, flat, &x, &dy)?;
                    let d = fc.backward_data(ctx, flat, &dy)?;
                    (Some(d), None)
                }
            };
            ctx.close(BWD, || span.clone(), t0)?;
            finished(ctx, flat, sync.as_deref_mut(), &node.slots)?;
            let mut send = |ctx: &mut Ctx, k: usize, d: GTensor| -> Result<(), CudaError> {
                if k == 0 {
                    return Ok(());
                }
                let v = &values[k];
                let d = as_stored(ctx, d, v.dt)?;
                if d.len() != v.len() {
                    return Err(CudaError::Check(format!(
                        "node{i}: a gradient of {} elements for a value of {}",
                        d.len(),
                        v.len()
                    )));
                }
                match &mut grads[k] {
                    Some(g) => elementwise(ctx, ADD_INTO, g, &d),
                    slot => {
                        // The value's own shape (a dense layer's gradient comes as rows × c).
                        *slot = Some(GTensor {
                            n: v.n,
                            h: v.h,
                            w: v.w,
                            c: v.c,
                            ..d
                        });
                        Ok(())
                    }
                }
            };
            let second_input = node.inputs.get(1).copied();
            if let (Some(d), Some(k)) = (second, second_input) {
                send(ctx, k, d)?;
            }
            if let Some(d) = dx {
                send(ctx, input, d)?;
            }
        }
        if let Some(g) = sync {
            g.end(ctx, flat)?;
        }
        Ok(())
    }
}

/// `t` stored as `dt` (itself when it is).
fn as_stored(ctx: &mut Ctx, t: GTensor, dt: Storage) -> Result<GTensor, CudaError> {
    ctx.convert(t, dt)
}

/// Tells the exchange that the gradients from the node's first slot on are final.
fn finished(
    ctx: &mut Ctx,
    flat: &Flat,
    sync: Option<&mut GradSync>,
    slots: &[Slot],
) -> Result<(), CudaError> {
    match (sync, slots.iter().map(|s| s.off).min()) {
        (Some(g), Some(lo)) => g.finished(ctx, flat, lo),
        _ => Ok(()),
    }
}

impl GpuGraph {
    /// One training step on this rank's share of the batch: forward, loss, backward, gradient
    /// allreduce (NCCL, in buckets), loss-scale check, SGD at `lr`, enqueued call by call; the
    /// host waits for the GPU once, at the end.
    pub fn step(
        &mut self,
        x: &Tensor<f32>,
        labels: &[usize],
        lr: f64,
        smoothing: f64,
        sgd: &roofline_models::train::Sgd,
    ) -> Result<StepResult, CudaError> {
        let (at_start, l32, scalars) = step_start(
            &mut self.ctx,
            (labels, x.n, self.classes),
            lr,
            &self.loss_scale,
            self.sync.as_ref(),
        )?;
        let io = StepIo::new(&self.ctx, self.store, x)?;
        io.fill(&mut self.ctx, &self.stager, x, &l32, &scalars)?;
        io.readout.clear_flag(&self.ctx)?;
        let z = self.forward(io.input(), true)?;
        let g = softmax_xent(&mut self.ctx, &z, &io, smoothing)?;
        drop(z);
        self.backward(g)?;
        let dynamic = self.loss_scale.dynamic;
        update(
            &mut self.ctx,
            &self.flat,
            dynamic,
            &io.readout,
            io.scalars.ptr,
            sgd,
        )?;
        let done = conclude(
            &mut self.ctx,
            self.sync.as_ref(),
            (&mut self.loss_scale, &mut self.skipped),
            &io.readout,
            at_start,
        )?;
        StepResult::of(&done, x.n)
    }

    /// Inference logits for a batch.
    pub fn logits(&mut self, x: &Tensor<f32>) -> Result<Tensor<f32>, CudaError> {
        self.ctx.gpu.bind()?;
        let xg = self.ctx.upload_in(self.store, x)?;
        let z = self.forward(xg, false)?;
        self.ctx.download(&z)
    }

    /// Writes the parameters, momenta and running statistics back into `model`.
    pub fn store(&mut self, model: &mut Graph<f32>) -> Result<(), CudaError> {
        store_params(&self.ctx, &self.flat, Model::params(model))?;
        let bns = self.nodes.iter().filter_map(|n| match &n.layer {
            GNode::BatchNorm { bn, .. } => Some(&**bn),
            _ => None,
        });
        store_running(&self.ctx, model.running_stats(), bns)
    }
}

impl GpuModel for GpuGraph {
    type Cpu = Graph<f32>;
    fn build(
        ctx: Ctx,
        model: &mut Graph<f32>,
        nccl: Option<Communicator>,
        reducer: Option<Arc<dyn Reducer>>,
        comm: CommOptions,
    ) -> Result<Self, CudaError> {
        GpuGraph::new(ctx, model, nccl, reducer, comm)
    }
    fn into_parts(self) -> (Ctx, Option<GradSync>) {
        (self.ctx, self.sync)
    }
    fn step(
        &mut self,
        x: &Tensor<f32>,
        truth: &roofline_models::train::Labels,
        _seed: u64,
        lr: f64,
        sgd: &roofline_models::train::Sgd,
    ) -> Result<roofline_models::train::Stepped<f64>, CudaError> {
        Ok(GpuGraph::step(self, x, &truth.classes, lr, truth.smoothing, sgd)?.stepped())
    }
    fn infer(&mut self, x: &Tensor<f32>) -> Result<Tensor<f32>, CudaError> {
        self.logits(x)
    }
    fn store(&mut self, model: &mut Graph<f32>) -> Result<(), CudaError> {
        GpuGraph::store(self, model)
    }
    fn stager(&self) -> Option<Arc<Stager>> {
        Some(Arc::clone(&self.stager))
    }
    fn ctx(&self) -> &Ctx {
        &self.ctx
    }
}
