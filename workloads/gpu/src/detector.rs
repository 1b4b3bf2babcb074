//! The EWA detector on the GPU (`roofline_models::detect::model::Detector`'s twin): the shared ResNet body
//! for C2–C5, the pyramid, the RPN head shared by P2–P6, multi-scale RoIAlign and the box head
//! on cuDNN, cuBLAS and NVRTC kernels, with f32 master weights in one flat store (the CPU's
//! parameter order, so a checkpoint moves between devices). The body keeps its activations in
//! the step's storage (16 bits in f16 and bf16, as the classifier's): the batch is staged in
//! it, C2–C5 are widened to f32 for the pyramid and their gradients narrowed back ("fpn.input"
//! spans); the pyramid, the RPN and the box head run on f32 activations. The RPN's losses and
//! proposals and the box head's losses are made on the device (`rpn_loss.rs`, `proposals.rs`,
//! `head_loss.rs`: the twins of `rpn::rpn_loss`, `rpn::proposals` and `head::head_loss`), and
//! so is the second stage's matching (`region_match`: `Matcher::HEAD` over each image's
//! proposals and boxes, the labels coming down with the proposals in one copy). What else the
//! CPU detector does on the host it does here too, with the same functions
//! (`roofline_models::detect::host`): the second stage's draw and box targets from those labels
//! (`regions_labelled`: the regions' labels and targets going up, RoIAlign's plan binned from
//! them), and the detections. The batch comes from the stager, uploaded on a copy stream during
//! the previous step. Data parallel: gradients summed by NCCL in buckets while the backward
//! pass runs (box head, RPN, pyramid, then the body block by block), batch-norm statistics
//! through the reducer.
use super::*;
use roofline_collectors::timeline::timed;
use roofline_models::detect::boxes::{AnchorGrid, BBox};
use roofline_models::detect::head::head_loss;
use roofline_models::detect::map::Detection;
use roofline_models::detect::matcher::Matcher;
use roofline_models::detect::model::{Detector, DetectorConfig, Losses, Target};
use roofline_models::detect::rpn::{proposals as rpn_proposals, rpn_loss};

/// The RPN head's outputs of every level on the host: (logits, deltas).
type HostOutputs = Vec<(Tensor<f32>, Tensor<f32>)>;

/// A step's RPN losses: made on the device (the gradients there, the values in the readout),
/// or on the host (the gradients uploaded, the (objectness, box) losses, the downloaded
/// outputs the proposals may be made from).
enum RpnGrads {
    Device(RpnLoss),
    Host(Vec<(GTensor, GTensor)>, f64, f64, HostOutputs),
}

/// The detector on one GPU.
pub struct GpuDetector {
    pub cfg: DetectorConfig,
    pub(super) flat: Flat,
    pub(super) body: GBody,
    pub(super) fpn: GFpn,
    pub(super) rpn: GRpn,
    pub(super) head: GBoxHead,
    pub loss_scale: LossScale,
    /// Steps skipped because the scaled gradients overflowed.
    pub skipped: usize,
    pub(super) sync: Option<GradSync>,
    /// Make the RPN's losses and proposals and the box head's losses on the host from the
    /// downloaded outputs (`rpn::rpn_loss`, `rpn::proposals`, `head::head_loss`), as before
    /// `detect.cu`, the gradients uploaded: for A/B measurements and as a fallback; set by the
    /// environment variable `ROOFLINE_HOST_RPN` (any value).
    pub host_rpn: bool,
    /// How the body stores its activations and their gradients: 16 bits in f16 and bf16 (the
    /// classifier's storage), else f32. The pyramid, the RPN and the box head keep theirs in
    /// f32, the stage outputs C2–C5 widened for them and their gradients narrowed back.
    pub store: Storage,
    /// Where the loader's thread stages the next batch (in `store`, as the body reads it).
    pub(super) stager: Arc<roofline_kernels::cuda::stage::Stager>,
    /// Declared last: dropped after every buffer above has been freed on its stream.
    pub ctx: Ctx,
}

/// What one detector step reports.
#[derive(Clone, Debug, PartialEq)]
pub struct DetectorStep {
    pub losses: Losses,
    /// Bytes this rank put into gradient allreduces.
    pub comm_bytes: f64,
    /// False when a loss-scale overflow skipped the update.
    pub applied: bool,
    /// The host's waits for the GPU during the step (the RPN's counts for the draw, the
    /// proposals, the step's last copy; on the host path the RPN's and the box head's outputs
    /// instead of the counts).
    pub host_syncs: u64,
    /// The device allocations during the step (none once the pool holds what a step needs).
    pub device_allocations: u64,
    /// Each image's proposals (what a comparison with the CPU holds fixed).
    pub proposals: Vec<Vec<BBox>>,
}

/// (depth, k) of every convolution filter of the detector, by parameter name.
fn detector_convs(model: &Detector<f32>) -> HashMap<String, (usize, usize)> {
    let mut v = conv_shapes(&model.backbone);
    v.extend(fpn_convs(&model.fpn));
    v.extend(rpn_convs(&model.rpn));
    v
}

/// (depth, k) of the pyramid's filters (lateral, then output), by parameter name.
pub(super) fn fpn_convs(
    f: &roofline_models::detect::fpn::Fpn<f32>,
) -> impl Iterator<Item = (String, (usize, usize))> + '_ {
    f.lateral
        .iter()
        .chain(&f.output)
        .map(|c| (c.weight.name.clone(), (c.shape.depth(), c.shape.k)))
}

/// (depth, k) of the RPN head's filters, by parameter name.
pub(super) fn rpn_convs(
    r: &roofline_models::detect::rpn::RpnHead<f32>,
) -> impl Iterator<Item = (String, (usize, usize))> + '_ {
    [&r.conv, &r.cls, &r.reg]
        .into_iter()
        .map(|c| (c.weight.name.clone(), (c.shape.depth(), c.shape.k)))
}

impl GpuDetector {
    /// Uploads `model` (parameters, momenta, running statistics) to `ctx`'s GPU. With `nccl`,
    /// gradients are summed over its ranks; `reducer` (the same ranks) sums the batch-norm
    /// statistics.
    pub fn new(
        ctx: Ctx,
        model: &mut Detector<f32>,
        nccl: Option<Communicator>,
        reducer: Option<Arc<dyn Reducer>>,
        comm: CommOptions,
    ) -> Result<GpuDetector, CudaError> {
        let convs = detector_convs(model);
        let flat = flat_params(&ctx, &model.params(), &convs)?;
        let slots = flat.slots.clone();
        // The body's slots come first (the backbone without its classifier), then the
        // pyramid's 8, the RPN's 6 and the box head's 8.
        let rest = 8 + 6 + 8;
        if slots.len() < rest {
            return Err(CudaError::Check("the detector's parameter list".into()));
        }
        let body_slots = slots.len() - rest;
        let mut it = slots[..body_slots].iter().copied();
        let mut next = || {
            it.next()
                .ok_or_else(|| CudaError::Check("the backbone's parameter list".into()))
        };
        let r = || reducer.clone();
        let body = GBody::new(&model.backbone, &mut next, &r)?;
        if it.next().is_some() {
            return Err(CudaError::Check(
                "the backbone has more parameters than its layers".into(),
            ));
        }
        let fpn = GFpn::new(&model.fpn, &slots[body_slots..body_slots + 8])?;
        let rpn = GRpn::new(&model.rpn, &slots[body_slots + 8..body_slots + 14])?;
        let head = GBoxHead::new(&model.head, &slots[body_slots + 14..])?;
        let (sync, loss_scale) = GradSync::with_scale(&ctx, nccl, comm, flat.total)?;
        let store = Storage::of(ctx.prec);
        let stager = Arc::new(roofline_kernels::cuda::stage::Stager::new(&ctx.gpu, store)?);
        Ok(GpuDetector {
            cfg: model.cfg.clone(),
            flat,
            body,
            fpn,
            rpn,
            head,
            loss_scale,
            skipped: 0,
            sync,
            host_rpn: std::env::var_os("ROOFLINE_HOST_RPN").is_some(),
            store,
            stager,
            ctx,
        })
    }

    /// Body, pyramid and RPN head: (P2–P6, the head's outputs per level, the levels' anchor
    /// grids).
    #[allow(clippy::type_complexity)]
    pub(super) fn first_stage(
        &mut self,
        x: &Tensor<f32>,
        train: bool,
    ) -> Result<(Vec<Rc<GTensor>>, Vec<(GTensor, GTensor)>, Vec<AnchorGrid>), CudaError> {
        if x.c != self.cfg.in_channels {
            return Err(CudaError::Check(format!(
                "the detector takes {} channels, the batch has {}",
                self.cfg.in_channels, x.c
            )));
        }
        self.ctx.gpu.bind()?;
        // The batch's copy to the GPU (data, not idle time, in `place`): out of the stager
        // when the loader's thread staged it (uploaded on the copy stream while the previous
        // step ran; this stream waits for it on the device), else uploaded now.
        let t0 = self.ctx.mark()?;
        let xg = self.ctx.tensor_in(self.store, x.n, x.h, x.w, x.c)?;
        // SAFETY: xg holds x's values in the stager's storage (the body's) and lives until the
        // copy has run (stream-ordered frees).
        let staged = unsafe { self.stager.take(&self.ctx.gpu, &x.data, xg.ptr())? };
        let xg = if staged {
            xg
        } else {
            self.ctx.upload_in(self.store, x)?
        };
        self.ctx.close(UPLOAD, || "input".into(), t0)?;
        let c = self
            .body
            .forward(&mut self.ctx, &self.flat, xg, train, true)?;
        // The pyramid reads C2–C5 in f32 (exact widening; nothing to do in f32).
        let t0 = self.ctx.mark()?;
        let c = self.widened(c)?;
        self.ctx.close(FWD, || "fpn.input".into(), t0)?;
        let t0 = self.ctx.mark()?;
        let p = self.fpn.forward(&mut self.ctx, &self.flat, &c, train)?;
        self.ctx.close(FWD, || "fpn".into(), t0)?;
        drop(c);
        let t0 = self.ctx.mark()?;
        let out = self.rpn.forward(&mut self.ctx, &self.flat, &p, train)?;
        self.ctx.close(FWD, || "rpn.head".into(), t0)?;
        let sizes: Vec<(usize, usize)> = p.iter().map(|m| (m.h, m.w)).collect();
        let grids = self.cfg.level_grids(&sizes);
        Ok((p, out, grids))
    }

    /// The body's stage outputs in f32, for the pyramid: the same tensors when the body stores
    /// f32, else widened copies (exact).
    fn widened(&mut self, c: Vec<Rc<GTensor>>) -> Result<Vec<Rc<GTensor>>, CudaError> {
        c.into_iter()
            .map(|t| {
                if t.dt == Storage::F32 {
                    return Ok(t);
                }
                let w = self.ctx.tensor(t.n, t.h, t.w, t.c)?;
                self.ctx
                    .cast_between(t.dt, Storage::F32, t.ptr(), w.ptr(), t.len())?;
                Ok(Rc::new(w))
            })
            .collect()
    }

    /// The RPN head's outputs on the host (what the host's losses and proposals read).
    pub(super) fn download_outputs(
        &self,
        out: &[(GTensor, GTensor)],
    ) -> Result<HostOutputs, CudaError> {
        out.iter()
            .map(|(o, d)| Ok((self.ctx.download(o)?, self.ctx.download(d)?)))
            .collect()
    }

    /// Each image's proposals by `rule`: on the device (`detect.cu`), or on the host from `host`
    /// (the downloaded outputs) when `host_rpn`; one span, "proposals". On the device and
    /// with `truth`, also the labels of each image's second-stage candidates (its proposals,
    /// then its boxes) by `Matcher::HEAD`, made there (else the host matches them).
    fn proposals(
        &mut self,
        out: &[(GTensor, GTensor)],
        host: Option<&[(Tensor<f32>, Tensor<f32>)]>,
        grids: &[AnchorGrid],
        rule: &roofline_models::detect::rpn::ProposalRule,
        (dims, truth): ((f64, f64), Option<&[Vec<BBox>]>),
    ) -> Result<(Vec<Vec<BBox>>, Option<CandidateLabels>), CudaError> {
        let boxes = |p: Vec<Vec<(BBox, f64)>>| -> Vec<Vec<BBox>> {
            p.into_iter()
                .map(|v| v.into_iter().map(|b| b.0).collect())
                .collect()
        };
        if self.host_rpn {
            let fetched;
            let host = match host {
                Some(h) => h,
                None => {
                    fetched = self.download_outputs(out)?;
                    &fetched
                }
            };
            let anc: Vec<Vec<BBox>> = grids.iter().map(AnchorGrid::anchors).collect();
            let images = out.first().map_or(0, |o| o.0.n);
            let (ih, iw) = dims;
            let p = timed(
                FWD,
                || "proposals".into(),
                || {
                    boxes(
                        (0..images)
                            .map(|n| rpn_proposals(host, &anc, n, iw, ih, rule))
                            .collect(),
                    )
                },
            );
            return Ok((p, None));
        }
        let t0 = self.ctx.mark()?;
        let (p, labels) = match truth {
            Some(t) => {
                let (p, l) =
                    self.ctx
                        .rpn_proposals_matched(out, grids, rule, dims, (t, Matcher::HEAD))?;
                (p, Some(l))
            }
            None => (self.ctx.rpn_proposals(out, grids, rule, dims)?, None),
        };
        self.ctx.close(FWD, || "proposals".into(), t0)?;
        Ok((boxes(p), labels))
    }

    /// The first offset of the box head's parameters, the RPN's and the pyramid's in the flat
    /// store (the ends of the gradient exchange's buckets).
    fn offsets(&self) -> (usize, usize, usize) {
        (
            self.head.fc6.first_offset(),
            self.rpn.conv.conv.w.off,
            self.fpn.lateral[0].w.off,
        )
    }

    /// One training step on this rank's share of the batch: forward, the losses,
    /// backward, gradient allreduce (NCCL, in buckets), loss-scale check, SGD at `lr`. `seed`
    /// fixes the sampling; `fixed` gives each image's proposals instead of the RPN's (a
    /// comparison with the CPU holds them fixed).
    pub fn step(
        &mut self,
        x: &Tensor<f32>,
        truth: &[Target],
        seed: u64,
        lr: f64,
        sgd: &roofline_models::train::Sgd,
        fixed: Option<&[Vec<BBox>]>,
    ) -> Result<DetectorStep, CudaError> {
        if truth.len() != x.n {
            return Err(CudaError::Check(format!(
                "{} targets for {} images",
                truth.len(),
                x.n
            )));
        }
        let (ih, iw) = (x.h as f64, x.w as f64);
        self.ctx.gpu.bind()?;
        let at_start = Counters::now(&self.ctx);
        self.ctx.clock_start()?;
        let (p, dev_out, grids) = self.first_stage(x, true)?;
        let boxes: Vec<Vec<BBox>> = truth.iter().map(|t| t.boxes.clone()).collect();
        let scale = self.loss_scale.scale;
        let per_image = self.cfg.rpn_per_image;
        // The RPN's losses: on the device, their terms read with the step's last copy (the
        // readout); or, with `host_rpn`, on the host from the downloaded outputs (spans as the
        // CPU's), their gradients uploaded.
        let (readout, rpn) = if self.host_rpn {
            let out = self.download_outputs(&dev_out)?;
            let anc: Vec<Vec<BBox>> = grids.iter().map(AnchorGrid::anchors).collect();
            let (obj, reg, grads) = timed(
                FWD,
                || "rpn.loss".into(),
                || rpn_loss(&out, &anc, &boxes, per_image, seed),
            );
            let mut g = Vec::with_capacity(grads.len());
            for (o, d) in grads {
                g.push((
                    upload_scaled(&self.ctx, o, scale)?,
                    upload_scaled(&self.ctx, d, scale)?,
                ));
            }
            (
                Readout::new(&self.ctx, 0)?,
                RpnGrads::Host(g, obj, reg, out),
            )
        } else {
            // The RPN's terms, then room for the box head's (`roi_per_image` regions an image
            // at most: the sampling's cap).
            let bytes =
                terms_bytes(x.n, per_image) + head_terms_bytes(x.n * self.cfg.roi_per_image);
            let readout = Readout::new(&self.ctx, bytes)?;
            let t0 = self.ctx.mark()?;
            let l = self.ctx.rpn_loss(
                &dev_out,
                &grids,
                &boxes,
                per_image,
                seed,
                scale,
                readout.buf.ptr,
            )?;
            self.ctx.close(FWD, || "rpn.loss".into(), t0)?;
            (readout, RpnGrads::Device(l))
        };
        let (props, labels) = match fixed {
            Some(f) => (f.to_vec(), None),
            None => {
                let rule = self.cfg.rpn_train;
                let host = match &rpn {
                    RpnGrads::Host(_, _, _, out) => Some(out.as_slice()),
                    RpnGrads::Device(_) => None,
                };
                self.proposals(
                    &dev_out,
                    host,
                    &grids,
                    &rule,
                    ((ih, iw), Some(boxes.as_slice())),
                )?
            }
        };
        drop(dev_out);
        let none: HostOutputs = Vec::new();
        // The proposals are given: `regions` reads neither the outputs nor the anchors. Their
        // candidates' labels come from the device where it matched them.
        let regions = timed(
            FWD,
            || "regions".into(),
            || match labels {
                Some(l) => self.cfg.regions_labelled(truth, seed, props, l),
                None => self
                    .cfg
                    .regions(&none, &[], truth, seed, Some(&props), (ih, iw)),
            },
        );
        let (rpn_objectness, rpn_box, rpn_grads, kept) = match rpn {
            RpnGrads::Host(g, obj, reg, _) => (obj, reg, g, None),
            RpnGrads::Device(l) => (0.0, 0.0, l.grads, Some(l.kept)),
        };
        let mut losses = Losses {
            rpn_objectness,
            rpn_box,
            regions: regions.rois.len(),
            ..Losses::default()
        };
        let (head_lo, rpn_lo, fpn_lo) = self.offsets();
        let ctx = &mut self.ctx;
        let flat = &self.flat;
        let mut sync = self.sync.as_mut();
        if let Some(g) = sync.as_deref_mut() {
            g.begin(flat.total);
        }
        // The second stage: RoIAlign, the box head, its losses.
        let mut head_rows = None;
        let mut dp: Vec<GTensor> = if regions.rois.is_empty() {
            // No region in the whole batch: no second-stage loss, no gradient for its
            // parameters (the last in the store) or for P2–P5 from it.
            ctx.zero(
                flat.grads.ptr + 4 * head_lo as u64,
                4 * (flat.total - head_lo),
            )?;
            let mut z = Vec::with_capacity(4);
            for m in &p[..4] {
                let t = ctx.tensor(m.n, m.h, m.w, m.c)?;
                ctx.zero(t.ptr(), 4 * t.len())?;
                z.push(t);
            }
            z
        } else {
            let maps = [&*p[0], &*p[1], &*p[2], &*p[3]];
            let t0 = ctx.mark()?;
            let plan = ctx.roi_plan(RoiPlan::new(&self.cfg.pool, &regions.rois, x.n), maps)?;
            let pooled = ctx.roi_align_forward(maps, &plan)?;
            ctx.close(FWD, || "roi_align".into(), t0)?;
            let t0 = ctx.mark()?;
            let (logits, deltas) = self.head.forward(ctx, flat, pooled)?;
            ctx.close(FWD, || "box_head".into(), t0)?;
            // Its losses: on the device, the terms read with the step's last copy; or, on
            // the host path, from its downloaded outputs, the gradients uploaded.
            let (dl, dd) = if self.host_rpn {
                let (hl, hd) = (ctx.download(&logits)?, ctx.download(&deltas)?);
                let (cls, reg, dl, dd) = head_loss(&hl, &hd, &regions.labels, &regions.targets);
                losses.classifier = cls;
                losses.box_reg = reg;
                (
                    upload_scaled(ctx, dl, scale)?,
                    upload_scaled(ctx, dd, scale)?,
                )
            } else {
                let at = terms_bytes(x.n, per_image);
                if at + head_terms_bytes(regions.rois.len()) > readout.bytes {
                    return Err(CudaError::Check(format!(
                        "{} regions for {} images: more than {} an image",
                        regions.rois.len(),
                        x.n,
                        self.cfg.roi_per_image
                    )));
                }
                let t0 = ctx.mark()?;
                let l = ctx.head_loss(
                    &logits,
                    &deltas,
                    &regions.labels,
                    &regions.targets,
                    scale,
                    readout.buf.ptr + at as u64,
                )?;
                ctx.close(FWD, || "box_head.loss".into(), t0)?;
                head_rows = Some(l.rows);
                (l.dlogits, l.ddeltas)
            };
            let t0 = ctx.mark()?;
            let dflat = self.head.backward(ctx, flat, &dl, &dd)?;
            ctx.close(BWD, || "box_head".into(), t0)?;
            if let Some(g) = sync.as_deref_mut() {
                g.finished(ctx, flat, head_lo)?;
            }
            let t0 = ctx.mark()?;
            let dp = ctx.roi_align_backward(&dflat, &plan)?;
            ctx.close(BWD, || "roi_align".into(), t0)?;
            dp
        };
        // The RPN head over every level; P6's gradient is the RPN's alone.
        let t0 = ctx.mark()?;
        let mut drpn = self.rpn.backward(ctx, flat, &rpn_grads)?;
        drop(rpn_grads);
        if let Some(s) = sync.as_deref_mut() {
            s.finished(ctx, flat, rpn_lo)?;
        }
        let d6 = drpn
            .pop()
            .ok_or_else(|| CudaError::Check("the RPN's gradients: P2–P6".into()))?;
        for (d, r) in dp.iter_mut().zip(&drpn) {
            elementwise(ctx, ADD_INTO, d, r)?;
        }
        ctx.close(BWD, || "rpn.head".into(), t0)?;
        drop(drpn);
        dp.push(d6);
        drop(p);
        let t0 = ctx.mark()?;
        let dc = self.fpn.backward(ctx, flat, dp)?;
        ctx.close(BWD, || "fpn".into(), t0)?;
        if let Some(s) = sync.as_deref_mut() {
            s.finished(ctx, flat, fpn_lo)?;
        }
        // The stage outputs' gradients in the body's storage (rounded once, as it adds them).
        let t0 = ctx.mark()?;
        let mut d = Vec::with_capacity(dc.len());
        for g in dc {
            d.push(Some(ctx.convert(g, self.store)?));
        }
        ctx.close(BWD, || "fpn.input".into(), t0)?;
        self.body.backward(ctx, flat, d, sync.as_deref_mut())?;
        if let Some(s) = sync {
            s.end(ctx, flat)?;
        }
        // The readout holds the RPN's and the box head's loss terms (none on the host path) and
        // the overflow flag.
        let done = finish_step(
            &mut self.ctx,
            &self.flat,
            self.sync.as_ref(),
            (&mut self.loss_scale, &mut self.skipped),
            (lr, sgd),
            readout,
            at_start,
        )?;
        let terms: Vec<f64> = done
            .loss_bytes
            .chunks_exact(8)
            .map(|b| f64::from_ne_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
            .collect();
        if let Some(kept) = kept {
            (losses.rpn_objectness, losses.rpn_box) =
                rpn_loss_sums(&terms, kept, kept.max(1) as f64);
        }
        if let Some(rows) = head_rows {
            let at = terms_bytes(x.n, per_image) / 8;
            (losses.classifier, losses.box_reg) = head_loss_sums(&terms[at..], rows);
        }
        Ok(DetectorStep {
            losses,
            comm_bytes: done.comm_bytes,
            applied: done.applied,
            host_syncs: done.host_syncs,
            device_allocations: done.device_allocations,
            proposals: regions.proposals,
        })
    }

    /// Detections for a batch (inference: batch norm on running statistics), as
    /// `Detector::detect` makes them.
    pub fn detect(&mut self, x: &Tensor<f32>) -> Result<Vec<Vec<Detection>>, CudaError> {
        let dims = (x.h as f64, x.w as f64);
        let (p, out, grids) = self.first_stage(x, false)?;
        let rule = self.cfg.rpn_test;
        let rois: Vec<(usize, BBox)> = self
            .proposals(&out, None, &grids, &rule, (dims, None))?
            .0
            .into_iter()
            .enumerate()
            .flat_map(|(n, v)| v.into_iter().map(move |b| (n, b)))
            .collect();
        drop(out);
        if rois.is_empty() {
            return Ok(vec![Vec::new(); x.n]);
        }
        let maps = [&*p[0], &*p[1], &*p[2], &*p[3]];
        let plan = self
            .ctx
            .roi_plan(RoiPlan::new(&self.cfg.pool, &rois, x.n), maps)?;
        let pooled = self.ctx.roi_align_forward(maps, &plan)?;
        let (logits, deltas) = self.head.forward(&mut self.ctx, &self.flat, pooled)?;
        let (hl, hd) = (self.ctx.download(&logits)?, self.ctx.download(&deltas)?);
        Ok(self.cfg.detections(&rois, &hl, &hd, x.n, dims))
    }

    /// Writes the parameters, momenta and running statistics back into `model`.
    pub fn store(&mut self, model: &mut Detector<f32>) -> Result<(), CudaError> {
        store_params(&self.ctx, &self.flat, model.params())?;
        store_running(&self.ctx, model.backbone.running_stats(), self.body.bns())
    }
}

/// `t × scale` on the device (a loss gradient made on the host, times the loss scale).
fn upload_scaled(ctx: &Ctx, mut t: Tensor<f32>, scale: f64) -> Result<GTensor, CudaError> {
    if scale != 1.0 {
        let s = scale as f32;
        t.data.iter_mut().for_each(|v| *v *= s);
    }
    ctx.upload(&t)
}
