//! CUDA graphs: the work enqueued on a GPU's stream between `Gpu::begin_capture` and
//! `Gpu::end_capture`, captured instead of run (`cuStreamBeginCapture` … `cuStreamEndCapture`),
//! instantiated once, and launched again as one unit (`cuGraphLaunch`): one host call where the
//! capture made hundreds, and no gaps between the kernels where the host would have been
//! launching the next one.
//!
//! A graph replays the calls as they were made: the same kernels with the same argument
//! values, the same copies between the same addresses. Whatever changes from one launch to
//! the next (a batch, a learning rate) must therefore be read by the kernels from device
//! memory that the host fills before each launch, outside the graph. The capture is
//! thread-local: a call of this thread that cannot be captured (a synchronisation, a copy to
//! pageable memory) fails and the capture is abandoned; other threads (the loader's, on its
//! own stream) go on as before.

use super::device::{check, Gpu};
use super::CudaError;
use cudarc::driver::result::{graph, stream};
use cudarc::driver::sys;

/// An instantiated graph and the graph it came from, destroyed on drop.
pub struct Graph {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
    /// The GPU's context, made current to destroy them.
    ctx: sys::CUcontext,
}

impl Gpu {
    /// Starts capturing this GPU's stream: what is enqueued on it from now on, until
    /// [`Gpu::end_capture`], is recorded into a graph instead of run. Every call to it must be
    /// followed by `end_capture`, whatever happens in between.
    pub fn begin_capture(&self) -> Result<(), CudaError> {
        self.bind()?;
        // SAFETY: our live stream; the caller ends the capture.
        check("cuStreamBeginCapture", unsafe {
            stream::begin_capture(
                self.stream,
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
        })
    }

    /// Ends the capture begun by [`Gpu::begin_capture`] and instantiates its graph; `work` is
    /// how the enqueueing went. When it failed, or a call it made could not be captured, the
    /// capture is thrown away, the stream is usable again and the error is returned (nothing
    /// of it ran on the GPU).
    pub fn end_capture<T>(&self, work: Result<T, CudaError>) -> Result<(Graph, T), CudaError> {
        // Rebind: the work may have made another context current (a library's handle).
        let _ = self.bind();
        // SAFETY: the capture begun on this stream; ending it returns the graph, or an error
        // when a captured call invalidated it (no graph is made then).
        let ended = check("cuStreamEndCapture", unsafe {
            stream::end_capture(self.stream)
        });
        let (g, value) = match (work, ended) {
            (Ok(v), Ok(g)) if !g.is_null() => (g, v),
            (Ok(_), Ok(_)) => {
                return Err(CudaError::Check(
                    "cuStreamEndCapture: the capture made no graph".into(),
                ))
            }
            (Err(e), Ok(g)) => {
                if !g.is_null() {
                    // SAFETY: a graph the capture made and nothing else holds.
                    unsafe {
                        let _ = graph::destroy(g);
                    }
                }
                return Err(e);
            }
            (Err(e), Err(_)) | (Ok(_), Err(e)) => return Err(e),
        };
        // SAFETY: a valid graph, instantiated with the default flags.
        match check("cuGraphInstantiateWithFlags", unsafe {
            graph::instantiate(g, sys::CUgraphInstantiate_flags(0))
        }) {
            Ok(exec) => Ok((
                Graph {
                    graph: g,
                    exec,
                    ctx: self.ctx,
                },
                value,
            )),
            Err(e) => {
                // SAFETY: the graph made above, held by nothing else.
                unsafe {
                    let _ = graph::destroy(g);
                }
                Err(e)
            }
        }
    }
}

impl Graph {
    /// Enqueues the whole graph on `gpu`'s stream (the GPU it was captured on), after the work
    /// enqueued there before it and before the work enqueued after it.
    pub fn launch(&self, gpu: &Gpu) -> Result<(), CudaError> {
        if gpu.ctx != self.ctx {
            return Err(CudaError::Check(
                "a CUDA graph launched on another GPU than it was captured on".into(),
            ));
        }
        // SAFETY: a live instantiated graph of this context, on its live stream.
        check("cuGraphLaunch", unsafe {
            graph::launch(self.exec, gpu.stream)
        })
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        // SAFETY: made by `Gpu::capture`, destroyed once, with their context current. An
        // executable graph still in flight is not cut short: the driver frees it when its
        // launches are done.
        unsafe {
            let _ = cudarc::driver::result::ctx::set_current(self.ctx);
            let _ = graph::exec_destroy(self.exec);
            let _ = graph::destroy(self.graph);
        }
    }
}
