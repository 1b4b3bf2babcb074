//! NCCL's functions, called through roofline's own table.
//!
//! cudarc opens NCCL by the names `libnccl.so`, `libnccl.so.<CUDA major>`, ... and never
//! `libnccl.so.2`, the only name the pip wheels (`nvidia-nccl-cu12`, `nvidia-nccl-cu13`) and
//! most cluster installs ship; so roofline takes each function it uses from the file that
//! [`super::libs::locate`] found, with `dlsym`, once. The types (communicator, unique id, data
//! types, reduction ops) are cudarc's `nccl::sys` ones; every status is read as a plain `int`
//! (an out-of-range value from a newer NCCL is then an error, not undefined behaviour) and
//! turned into an error that names the call and carries `ncclGetErrorString`'s words.

use super::libs::{self, Lib};
use super::CudaError;
use cudarc::nccl::sys as ns;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::OnceLock;

type Status = c_int;

/// The NCCL functions roofline calls.
pub struct Nccl {
    pub path: String,
    get_version: unsafe extern "C" fn(*mut c_int) -> Status,
    get_unique_id: unsafe extern "C" fn(*mut ns::ncclUniqueId) -> Status,
    comm_init_rank:
        unsafe extern "C" fn(*mut ns::ncclComm_t, c_int, ns::ncclUniqueId, c_int) -> Status,
    comm_destroy: unsafe extern "C" fn(ns::ncclComm_t) -> Status,
    get_error_string: unsafe extern "C" fn(Status) -> *const c_char,
    all_reduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        ns::ncclDataType_t,
        ns::ncclRedOp_t,
        ns::ncclComm_t,
        ns::cudaStream_t,
    ) -> Status,
    all_gather: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        ns::ncclDataType_t,
        ns::ncclComm_t,
        ns::cudaStream_t,
    ) -> Status,
    reduce_scatter: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        ns::ncclDataType_t,
        ns::ncclRedOp_t,
        ns::ncclComm_t,
        ns::cudaStream_t,
    ) -> Status,
    broadcast: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        ns::ncclDataType_t,
        c_int,
        ns::ncclComm_t,
        ns::cudaStream_t,
    ) -> Status,
    send: unsafe extern "C" fn(
        *const c_void,
        usize,
        ns::ncclDataType_t,
        c_int,
        ns::ncclComm_t,
        ns::cudaStream_t,
    ) -> Status,
    recv: unsafe extern "C" fn(
        *mut c_void,
        usize,
        ns::ncclDataType_t,
        c_int,
        ns::ncclComm_t,
        ns::cudaStream_t,
    ) -> Status,
    group_start: unsafe extern "C" fn() -> Status,
    group_end: unsafe extern "C" fn() -> Status,
}

// SAFETY: plain function pointers into a library that is never unloaded.
unsafe impl Send for Nccl {}
unsafe impl Sync for Nccl {}

static NCCL: OnceLock<Result<Nccl, String>> = OnceLock::new();

/// The table, loaded on first use; the error says where we looked, or which function is missing.
pub fn get() -> Result<&'static Nccl, CudaError> {
    NCCL.get_or_init(load)
        .as_ref()
        .map_err(|e| CudaError::Missing(e.clone()))
}

fn load() -> Result<Nccl, String> {
    let path = libs::locate(Lib::Nccl).ok_or_else(|| libs::not_found(Lib::Nccl))?;
    let c = CString::new(path.clone()).map_err(|_| format!("{path}: a NUL in the path"))?;
    // SAFETY: the library is loaded already (locate keeps it open); this takes its handle.
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    if h.is_null() {
        return Err(format!("{path}: dlopen failed"));
    }
    let sym = |name: &CStr| -> Result<*mut c_void, String> {
        // SAFETY: a live handle and a C string.
        let p = unsafe { libc::dlsym(h, name.as_ptr()) };
        if p.is_null() {
            Err(format!(
                "{path} lacks {} (NCCL 2.7 or newer is needed)",
                name.to_string_lossy()
            ))
        } else {
            Ok(p)
        }
    };
    // SAFETY: each symbol is NCCL's function of that name, with the signature of nccl.h
    // (unchanged since NCCL 2.7); `as_fn` turns the address into that function pointer.
    unsafe {
        Ok(Nccl {
            path: path.clone(),
            get_version: as_fn(sym(c"ncclGetVersion")?),
            get_unique_id: as_fn(sym(c"ncclGetUniqueId")?),
            comm_init_rank: as_fn(sym(c"ncclCommInitRank")?),
            comm_destroy: as_fn(sym(c"ncclCommDestroy")?),
            get_error_string: as_fn(sym(c"ncclGetErrorString")?),
            all_reduce: as_fn(sym(c"ncclAllReduce")?),
            all_gather: as_fn(sym(c"ncclAllGather")?),
            reduce_scatter: as_fn(sym(c"ncclReduceScatter")?),
            broadcast: as_fn(sym(c"ncclBroadcast")?),
            send: as_fn(sym(c"ncclSend")?),
            recv: as_fn(sym(c"ncclRecv")?),
            group_start: as_fn(sym(c"ncclGroupStart")?),
            group_end: as_fn(sym(c"ncclGroupEnd")?),
        })
    }
}

/// A function pointer from a symbol's address.
///
/// # Safety
/// `p` is the address of a function whose C signature is exactly `F`'s.
unsafe fn as_fn<F: Copy>(p: *mut c_void) -> F {
    assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>());
    std::mem::transmute_copy(&p)
}

impl Nccl {
    /// `Ok` for ncclSuccess, else the error naming `call` with NCCL's own words.
    fn check(&self, call: &str, s: Status) -> Result<(), CudaError> {
        if s == 0 {
            return Ok(());
        }
        // SAFETY: ncclGetErrorString returns a static C string for any code.
        let words = unsafe {
            let p = (self.get_error_string)(s);
            if p.is_null() {
                String::new()
            } else {
                CStr::from_ptr(p).to_string_lossy().into_owned()
            }
        };
        Err(CudaError::Call {
            call: call.into(),
            detail: format!("ncclResult {s}: {words}"),
        })
    }

    /// NCCL's version code (e.g. 22105 for 2.21.5).
    pub fn version(&self) -> Result<i32, CudaError> {
        let mut v = 0;
        // SAFETY: one out-parameter.
        self.check("ncclGetVersion", unsafe { (self.get_version)(&mut v) })?;
        Ok(v)
    }

    pub fn unique_id(&self) -> Result<ns::ncclUniqueId, CudaError> {
        let mut id = ns::ncclUniqueId { internal: [0; 128] };
        // SAFETY: one out-parameter.
        self.check("ncclGetUniqueId", unsafe { (self.get_unique_id)(&mut id) })?;
        Ok(id)
    }

    /// # Safety
    /// Every rank calls it collectively with the same id, with its GPU's context current.
    pub unsafe fn comm_init_rank(
        &self,
        ranks: i32,
        id: ns::ncclUniqueId,
        rank: i32,
    ) -> Result<ns::ncclComm_t, CudaError> {
        let mut comm: ns::ncclComm_t = std::ptr::null_mut();
        self.check(
            "ncclCommInitRank",
            (self.comm_init_rank)(&mut comm, ranks, id, rank),
        )?;
        Ok(comm)
    }

    /// # Safety
    /// `comm` was created by [`Nccl::comm_init_rank`] and is destroyed once.
    pub unsafe fn comm_destroy(&self, comm: ns::ncclComm_t) -> Result<(), CudaError> {
        self.check("ncclCommDestroy", (self.comm_destroy)(comm))
    }

    /// # Safety
    /// Device buffers of the communicator's GPU holding `count` elements; a live stream.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn all_reduce(
        &self,
        send: *const c_void,
        recv: *mut c_void,
        count: usize,
        ty: ns::ncclDataType_t,
        op: ns::ncclRedOp_t,
        comm: ns::ncclComm_t,
        stream: ns::cudaStream_t,
    ) -> Result<(), CudaError> {
        self.check(
            "ncclAllReduce",
            (self.all_reduce)(send, recv, count, ty, op, comm, stream),
        )
    }

    /// # Safety
    /// As [`Nccl::all_reduce`]; `recv` holds `count` × ranks elements.
    pub unsafe fn all_gather(
        &self,
        send: *const c_void,
        recv: *mut c_void,
        count: usize,
        ty: ns::ncclDataType_t,
        comm: ns::ncclComm_t,
        stream: ns::cudaStream_t,
    ) -> Result<(), CudaError> {
        self.check(
            "ncclAllGather",
            (self.all_gather)(send, recv, count, ty, comm, stream),
        )
    }

    /// # Safety
    /// As [`Nccl::all_reduce`]; `send` holds `recv_count` × ranks elements.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn reduce_scatter(
        &self,
        send: *const c_void,
        recv: *mut c_void,
        recv_count: usize,
        ty: ns::ncclDataType_t,
        op: ns::ncclRedOp_t,
        comm: ns::ncclComm_t,
        stream: ns::cudaStream_t,
    ) -> Result<(), CudaError> {
        self.check(
            "ncclReduceScatter",
            (self.reduce_scatter)(send, recv, recv_count, ty, op, comm, stream),
        )
    }

    /// # Safety
    /// As [`Nccl::all_reduce`].
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn broadcast(
        &self,
        send: *const c_void,
        recv: *mut c_void,
        count: usize,
        ty: ns::ncclDataType_t,
        root: i32,
        comm: ns::ncclComm_t,
        stream: ns::cudaStream_t,
    ) -> Result<(), CudaError> {
        self.check(
            "ncclBroadcast",
            (self.broadcast)(send, recv, count, ty, root, comm, stream),
        )
    }

    /// # Safety
    /// A device buffer of `count` elements; inside a group with the matching receive.
    pub unsafe fn send(
        &self,
        buf: *const c_void,
        count: usize,
        ty: ns::ncclDataType_t,
        peer: i32,
        comm: ns::ncclComm_t,
        stream: ns::cudaStream_t,
    ) -> Result<(), CudaError> {
        self.check("ncclSend", (self.send)(buf, count, ty, peer, comm, stream))
    }

    /// # Safety
    /// As [`Nccl::send`].
    pub unsafe fn recv(
        &self,
        buf: *mut c_void,
        count: usize,
        ty: ns::ncclDataType_t,
        peer: i32,
        comm: ns::ncclComm_t,
        stream: ns::cudaStream_t,
    ) -> Result<(), CudaError> {
        self.check("ncclRecv", (self.recv)(buf, count, ty, peer, comm, stream))
    }

    pub fn group_start(&self) -> Result<(), CudaError> {
        // SAFETY: no arguments.
        self.check("ncclGroupStart", unsafe { (self.group_start)() })
    }

    pub fn group_end(&self) -> Result<(), CudaError> {
        // SAFETY: no arguments.
        self.check("ncclGroupEnd", unsafe { (self.group_end)() })
    }
}
