//! The private raw layer of [`super`]: the shim's C types, its status codes and the table of its
//! functions resolved from the loaded library. Nothing here is called outside `ffi.rs`, which
//! wraps every call in a safe method.

use std::os::raw::{c_char, c_int};
use std::path::Path;

use libloading::Library;

use super::ShimError;

pub const E_NULL: i64 = -1001;
pub const E_EXCEPTION: i64 = -1002;
#[cfg_attr(not(test), allow(dead_code))] // reported as ShimError::Status
pub const E_BUFFER: i64 = -1003;
pub const E_LLAMA: i64 = -1004;

/// `kvaudit_shim_setting`: a NUL-terminated key and its value.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Setting {
    pub key: *const c_char,
    pub value: i64,
}

/// The opaque `kvaudit_shim` handle.
#[repr(C)]
pub struct Handle {
    _private: [u8; 0],
}

/// A shim call that writes a NUL-terminated text of at most the given capacity into the buffer
/// and returns the text's full length (or a negative error code).
pub type TextFn = unsafe extern "C" fn(*mut Handle, *mut c_char, usize) -> i32;

/// The library and every function of kvaudit_shim.h, loaded together. The pointers are
/// only valid while `_lib` is loaded, which is as long as this struct lives; they are
/// private to `ffi` and never copied out of it.
pub struct Api {
    pub version: unsafe extern "C" fn() -> *const c_char,
    pub state_seq_format: unsafe extern "C" fn() -> i32,
    pub assertions_enabled: unsafe extern "C" fn() -> i32,
    pub open: unsafe extern "C" fn(
        *const c_char,
        *const Setting,
        usize,
        *mut c_char,
        usize,
    ) -> *mut Handle,
    pub setting_value: unsafe extern "C" fn(*mut Handle, *const c_char, *mut i64) -> i32,
    pub model_arch: TextFn,
    pub memory_log: TextFn,
    pub close: unsafe extern "C" fn(*mut Handle),
    pub decode: unsafe extern "C" fn(
        *mut Handle,
        i32,
        *const i32,
        *const i32,
        *const i32,
        *const i32,
        i32,
    ) -> i32,
    pub seq_rm: unsafe extern "C" fn(*mut Handle, i32, i32, i32) -> i32,
    pub seq_cp: unsafe extern "C" fn(*mut Handle, i32, i32, i32, i32) -> i32,
    pub seq_keep: unsafe extern "C" fn(*mut Handle, i32) -> i32,
    pub seq_add: unsafe extern "C" fn(*mut Handle, i32, i32, i32, i32) -> i32,
    pub seq_div: unsafe extern "C" fn(*mut Handle, i32, i32, i32, i32) -> i32,
    pub clear: unsafe extern "C" fn(*mut Handle, i32) -> i32,
    pub seq_pos_min: unsafe extern "C" fn(*mut Handle, i32, *mut i32) -> i32,
    pub seq_pos_max: unsafe extern "C" fn(*mut Handle, i32, *mut i32) -> i32,
    pub state_seq_size: unsafe extern "C" fn(*mut Handle, i32) -> i64,
    pub state_seq_get: unsafe extern "C" fn(*mut Handle, i32, *mut u8, usize) -> i64,
    pub state_seq_set: unsafe extern "C" fn(*mut Handle, i32, *const u8, usize) -> i64,
    pub state_seq_size_ext: unsafe extern "C" fn(*mut Handle, i32, u32) -> i64,
    pub state_seq_get_ext: unsafe extern "C" fn(*mut Handle, i32, *mut u8, usize, u32) -> i64,
    pub state_seq_set_ext: unsafe extern "C" fn(*mut Handle, i32, *const u8, usize, u32) -> i64,
    pub n_ctx: unsafe extern "C" fn(*mut Handle) -> i64,
    pub n_seq_max: unsafe extern "C" fn(*mut Handle) -> i64,
    pub n_batch: unsafe extern "C" fn(*mut Handle) -> i64,
    pub n_ubatch: unsafe extern "C" fn(*mut Handle) -> i64,
    pub state_size: unsafe extern "C" fn(*mut Handle) -> i64,
    pub state_get: unsafe extern "C" fn(*mut Handle, *mut u8, usize) -> i64,
    pub state_set: unsafe extern "C" fn(*mut Handle, *const u8, usize) -> i64,
    pub n_vocab: unsafe extern "C" fn(*mut Handle) -> i32,
    pub get_logits_ith: unsafe extern "C" fn(*mut Handle, i32, *mut f32, i32) -> i32,
    pub last_error: unsafe extern "C" fn(*mut c_char, usize) -> usize,
    /// `kvaudit_shim_cov_enable` and `kvaudit_shim_cov_take` of `kvaudit_cov.c`: only a
    /// `+cov` build has them.
    pub cov: Option<Cov>,
    // Declared last: dropped after nothing else can use the pointers above.
    _lib: Library,
}

/// The coverage runtime's functions (`shim/kvaudit_cov.c`).
#[derive(Clone, Copy)]
pub struct Cov {
    pub enable: unsafe extern "C" fn(c_int),
    pub take: unsafe extern "C" fn(*mut u32, usize, *mut usize, *mut u32, usize, *mut usize) -> u32,
    /// `kvaudit_shim_cov_take_outside` (and mode 2 of `enable`): runtimes before it lack it.
    pub take_outside: Option<unsafe extern "C" fn(*mut u32, usize) -> usize>,
}

/// Copies one function pointer out of `lib`.
///
/// # Safety
/// `T` must be the exact `unsafe extern "C" fn` type of the C symbol `name` (a
/// NUL-terminated byte string), and the returned pointer must not be called after `lib`
/// is unloaded.
unsafe fn symbol<T: Copy>(lib: &Library, path: &Path, name: &[u8]) -> Result<T, ShimError> {
    let sym = lib.get::<T>(name).map_err(|e| ShimError::Symbol {
        path: path.to_path_buf(),
        name: String::from_utf8_lossy(&name[..name.len() - 1]).into_owned(),
        message: e.to_string(),
    })?;
    Ok(*sym)
}

impl Api {
    /// Loads the shared object and checks its ABI number before taking any other symbol.
    /// Returns `Ok(Err(found))` on an ABI mismatch.
    ///
    /// # Safety
    /// Loading runs the library's initializers; `path` must be a `libkvaudit_shim.so`
    /// built by `super::super::build` (llama.cpp/ggml static constructors only), or at
    /// least a library whose initializers are sound to run in this process. The function
    /// types below must match kvaudit_shim.h for the ABI number the library reports.
    pub unsafe fn load(path: &Path, expected_abi: u32) -> Result<Result<Api, i32>, ShimError> {
        // RTLD_NODELETE: never unmapped, even after the last handle drops. ggml installs a
        // process-wide terminate handler on load; unloading would leave it pointing at
        // unmapped code, and loading the pin again then trips
        // `GGML_ASSERT(prev != ggml_uncaught_exception)` (seen when one process measured a
        // pin twice).
        let flags = libloading::os::unix::RTLD_NOW | libc::RTLD_NODELETE;
        let lib: Library = libloading::os::unix::Library::open(Some(path), flags)
            .map_err(|e| ShimError::Load {
                path: path.to_path_buf(),
                message: e.to_string(),
            })?
            .into();
        let abi_version: unsafe extern "C" fn() -> c_int =
            symbol(&lib, path, b"kvaudit_shim_abi_version\0")?;
        let found = abi_version();
        if found < 0 || found as u32 != expected_abi {
            return Ok(Err(found));
        }
        Ok(Ok(Api {
            version: symbol(&lib, path, b"kvaudit_shim_version\0")?,
            state_seq_format: symbol(&lib, path, b"kvaudit_shim_state_seq_format\0")?,
            assertions_enabled: symbol(&lib, path, b"kvaudit_shim_assertions_enabled\0")?,
            open: symbol(&lib, path, b"kvaudit_shim_open\0")?,
            setting_value: symbol(&lib, path, b"kvaudit_shim_setting_value\0")?,
            model_arch: symbol(&lib, path, b"kvaudit_shim_model_arch\0")?,
            memory_log: symbol(&lib, path, b"kvaudit_shim_memory_log\0")?,
            close: symbol(&lib, path, b"kvaudit_shim_close\0")?,
            decode: symbol(&lib, path, b"kvaudit_shim_decode\0")?,
            seq_rm: symbol(&lib, path, b"kvaudit_shim_seq_rm\0")?,
            seq_cp: symbol(&lib, path, b"kvaudit_shim_seq_cp\0")?,
            seq_keep: symbol(&lib, path, b"kvaudit_shim_seq_keep\0")?,
            seq_add: symbol(&lib, path, b"kvaudit_shim_seq_add\0")?,
            seq_div: symbol(&lib, path, b"kvaudit_shim_seq_div\0")?,
            clear: symbol(&lib, path, b"kvaudit_shim_clear\0")?,
            seq_pos_min: symbol(&lib, path, b"kvaudit_shim_seq_pos_min\0")?,
            seq_pos_max: symbol(&lib, path, b"kvaudit_shim_seq_pos_max\0")?,
            state_seq_size: symbol(&lib, path, b"kvaudit_shim_state_seq_size\0")?,
            state_seq_get: symbol(&lib, path, b"kvaudit_shim_state_seq_get\0")?,
            state_seq_set: symbol(&lib, path, b"kvaudit_shim_state_seq_set\0")?,
            state_seq_size_ext: symbol(&lib, path, b"kvaudit_shim_state_seq_size_ext\0")?,
            state_seq_get_ext: symbol(&lib, path, b"kvaudit_shim_state_seq_get_ext\0")?,
            state_seq_set_ext: symbol(&lib, path, b"kvaudit_shim_state_seq_set_ext\0")?,
            n_ctx: symbol(&lib, path, b"kvaudit_shim_n_ctx\0")?,
            n_seq_max: symbol(&lib, path, b"kvaudit_shim_n_seq_max\0")?,
            n_batch: symbol(&lib, path, b"kvaudit_shim_n_batch\0")?,
            n_ubatch: symbol(&lib, path, b"kvaudit_shim_n_ubatch\0")?,
            state_size: symbol(&lib, path, b"kvaudit_shim_state_size\0")?,
            state_get: symbol(&lib, path, b"kvaudit_shim_state_get\0")?,
            state_set: symbol(&lib, path, b"kvaudit_shim_state_set\0")?,
            n_vocab: symbol(&lib, path, b"kvaudit_shim_n_vocab\0")?,
            get_logits_ith: symbol(&lib, path, b"kvaudit_shim_get_logits_ith\0")?,
            last_error: symbol(&lib, path, b"kvaudit_shim_last_error\0")?,
            // A build without the coverage runtime lacks its symbols; then none is taken.
            cov: match symbol(&lib, path, b"kvaudit_shim_cov_enable\0") {
                Ok(enable) => Some(Cov {
                    enable,
                    take: symbol(&lib, path, b"kvaudit_shim_cov_take\0")?,
                    take_outside: symbol(&lib, path, b"kvaudit_shim_cov_take_outside\0").ok(),
                }),
                Err(_) => None,
            },
            _lib: lib,
        }))
    }

    /// The error log text of the last shim call on this thread.
    pub fn last_error(&self) -> String {
        let mut buf = vec![0u8; 4096];
        // SAFETY: buf is writable for buf.len() bytes; the shim writes at most that many,
        // NUL included, and only reads its thread-local buffer.
        let n = unsafe { (self.last_error)(buf.as_mut_ptr().cast(), buf.len()) };
        buf.truncate(n.min(buf.len() - 1));
        String::from_utf8_lossy(&buf).trim_end().to_string()
    }
}
