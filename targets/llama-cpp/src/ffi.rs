//! The fenced FFI module: the only code that calls into llama.cpp.
//!
//! Two layers, as in git2/libgit2-sys and rusqlite:
//! - `raw` (private): the C ABI of `shim/kvaudit_shim.h`. One struct holds the
//!   `libloading::Library` together with every function pointer taken from it, so no symbol
//!   can outlive its library, and the pointers never leave this module.
//! - the safe layer: [`LlamaShim`] (one loaded `libkvaudit_shim.so`, shareable) and
//!   [`LlamaContext`] (one model + context, freed in `Drop`). Each keeps the library alive
//!   through an `Arc`.
//!
//! Errors: `Err` means the harness or the shim broke (library missing, ABI mismatch, NULL
//! handle, buffer too small, an exception caught at the C boundary), as a [`ShimError`]. What
//! llama.cpp *does* is returned as values: `decode`'s return code, `seq_rm`'s bool, positions,
//! state bytes. llama.cpp aborts (GGML_ASSERT, `assert` in `+assert`
//! builds) cannot be caught here; run contexts that may hit one in a child process with
//! `GGML_NO_BACKTRACE=1`.
//!
//! This module and [`super::sys`] (libc) are the only ones with `unsafe`. It imports the shim's
//! description from [`super::shim`], never from the build.
//!
//! No Rust code is ever called from C (the shim's log callback is C), so no panic can unwind
//! across the boundary, and the shim catches every C++ exception before it reaches Rust.

use std::os::raw::c_int;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::Arc;

pub use super::error::ShimError;
use super::shim::{BuiltShim, SHIM_ABI};

/// The private raw layer: C types and the function table.
mod raw;

/// Model and context settings for [`LlamaShim::open`]: (key, value) pairs as the shim takes them
/// (`kvaudit_shim_setting`: a `llama_context_params` field's name, its value as an integer:
/// counts as they are, flags 0/1, cache types as their `enum ggml_type`), which
/// `kvaudit_shim_open` applies to `llama_context_params` key by key, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContextParams {
    settings: Vec<(String, i64)>,
}

impl ContextParams {
    /// The same with `key` set to `value` (replaced, or added at the end). A key has no NUL.
    pub fn with(mut self, key: &str, value: i64) -> ContextParams {
        match self.settings.iter_mut().find(|(k, _)| k == key) {
            Some((_, v)) => *v = value,
            None => self.settings.push((key.to_string(), value)),
        }
        self
    }

    /// The value of `key`, if set.
    pub fn get(&self, key: &str) -> Option<i64> {
        self.settings
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| *v)
    }

    /// The settings, in the order the shim applies them.
    pub fn settings(&self) -> &[(String, i64)] {
        &self.settings
    }

    /// The keys as C strings and the pairs pointing into them. The pairs are valid while the
    /// keys live.
    fn to_raw(&self) -> (Vec<std::ffi::CString>, Vec<raw::Setting>) {
        let keys: Vec<std::ffi::CString> = self
            .settings
            .iter()
            .map(|(k, _)| std::ffi::CString::new(k.as_str()).expect("key names have no NUL"))
            .collect();
        let pairs = keys
            .iter()
            .zip(&self.settings)
            .map(|(k, (_, v))| raw::Setting {
                key: k.as_ptr(),
                value: *v,
            })
            .collect();
        (keys, pairs)
    }
}

/// What the coverage runtime of a `+cov` build recorded since its last take: PC offsets into
/// the shared object and edges (with their hit-count class), each distinct, in the order first
/// reached (`shim/kvaudit_cov.c`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CovPoints {
    /// PC offsets (return addresses of the coverage callback, minus the load base).
    pub pcs: Vec<u32>,
    /// Edge hashes, each mixed with its hit-count class.
    pub edges: Vec<u32>,
}

/// What the coverage runtime of a `+cov` build records (`shim/kvaudit_cov.c`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CovMode {
    /// Nothing.
    Off,
    /// The PCs and edges of a trace's ops, taken per trial ([`LlamaShim::cov_take`]).
    Ops,
    /// PCs of everything else (construction, setup, resets, observations), into a set that
    /// hands each point out once ([`LlamaShim::cov_take_outside`]).
    Outside,
}

/// One loaded `libkvaudit_shim.so`. Cheap to clone; several pins load side by side.
#[derive(Clone)]
pub struct LlamaShim {
    api: Arc<raw::Api>,
    path: PathBuf,
    version: String,
}

impl std::fmt::Debug for LlamaShim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlamaShim")
            .field("path", &self.path)
            .field("version", &self.version)
            .finish()
    }
}

impl LlamaShim {
    /// Loads a shim and checks its ABI number.
    pub fn load(path: &Path) -> Result<LlamaShim, ShimError> {
        // SAFETY: the path names a kvaudit shim (the ABI number is checked before any other
        // symbol is used), whose initializers are llama.cpp's and ggml's static constructors;
        // the function types in raw::Api are those of kvaudit_shim.h for SHIM_ABI.
        let api = match unsafe { raw::Api::load(path, SHIM_ABI)? } {
            Ok(api) => api,
            Err(found) => {
                return Err(ShimError::AbiMismatch {
                    path: path.to_path_buf(),
                    found,
                    expected: SHIM_ABI,
                })
            }
        };
        // SAFETY: returns a pointer to a static NUL-terminated string in the library, which
        // `api` keeps loaded while we copy it.
        let version = unsafe {
            let p = (api.version)();
            if p.is_null() {
                String::new()
            } else {
                std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned()
            }
        };
        Ok(LlamaShim {
            api: Arc::new(api),
            path: path.to_path_buf(),
            version,
        })
    }

    /// Loads a built shim and checks that it was built for the build's pin.
    pub fn load_built(built: &BuiltShim) -> Result<LlamaShim, ShimError> {
        let shim = LlamaShim::load(&built.so_path)?;
        let expected = built.pin.label();
        if shim.version != expected {
            return Err(ShimError::WrongPin {
                path: shim.path.clone(),
                found: shim.version.clone(),
                expected,
            });
        }
        Ok(shim)
    }

    /// Whether this build records the code its memory sources reach (a `+cov` build).
    pub fn records_coverage(&self) -> bool {
        self.api.cov.is_some()
    }

    /// Whether this build also records the code run outside a trace's ops
    /// ([`CovMode::Outside`]; `+cov` builds of runtimes before it record the ops only).
    pub fn records_outside_ops(&self) -> bool {
        self.api.cov.is_some_and(|c| c.take_outside.is_some())
    }

    /// Sets what the coverage runtime records (nothing on a build without it; on a build that
    /// cannot record outside the ops, [`CovMode::Outside`] is off).
    pub fn cov_record(&self, mode: CovMode) {
        let Some(cov) = self.api.cov else { return };
        let code: c_int = match mode {
            CovMode::Off => 0,
            CovMode::Ops => 1,
            CovMode::Outside if cov.take_outside.is_some() => 2,
            CovMode::Outside => 0,
        };
        // SAFETY: takes an int and sets two static variables of the library.
        unsafe { (cov.enable)(code) }
    }

    /// The PC offsets first reached in [`CovMode::Outside`] since the last call, each handed
    /// out once per process (a forked child inherits what its parent had taken): `None` on a
    /// build that does not record them.
    pub fn cov_take_outside(&self) -> Option<Vec<u32>> {
        let take = self.api.cov?.take_outside?;
        const CAP: usize = 1 << 15;
        let mut pcs = vec![0u32; CAP];
        // SAFETY: the buffer is writable for CAP u32s and the runtime writes at most CAP of them.
        let n = unsafe { take(pcs.as_mut_ptr(), CAP) };
        pcs.truncate(n.min(CAP));
        Some(pcs)
    }

    /// The points recorded since the last take (which it clears): `None` on a build without
    /// coverage. Points beyond the runtime's capacity are dropped (it holds 32,768 of each).
    pub fn cov_take(&self) -> Option<CovPoints> {
        let cov = self.api.cov?;
        const CAP: usize = 1 << 15;
        let mut pcs = vec![0u32; CAP];
        let mut edges = vec![0u32; CAP];
        let (mut n_pcs, mut n_edges) = (0usize, 0usize);
        // SAFETY: both buffers are writable for CAP u32s, the runtime writes at most cap of
        // each and the counts into the two usizes, and touches nothing else of ours.
        unsafe {
            (cov.take)(
                pcs.as_mut_ptr(),
                CAP,
                &mut n_pcs,
                edges.as_mut_ptr(),
                CAP,
                &mut n_edges,
            );
        }
        pcs.truncate(n_pcs.min(CAP));
        edges.truncate(n_edges.min(CAP));
        Some(CovPoints { pcs, edges })
    }

    /// The pin label compiled into the shim, e.g. `llama.cpp@0.1.156+assert`.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The library path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `LLAMA_STATE_SEQ_VERSION` of the pin's llama.h (2 or 4).
    pub fn state_seq_format(&self) -> i32 {
        // SAFETY: no arguments; returns a compile-time constant.
        unsafe { (self.api.state_seq_format)() }
    }

    /// True for `+assert` builds (compiled without NDEBUG).
    pub fn assertions_enabled(&self) -> bool {
        // SAFETY: no arguments; returns a compile-time constant.
        unsafe { (self.api.assertions_enabled)() != 0 }
    }

    /// Loads `model` (CPU only) and creates a context with `params`.
    pub fn open(&self, model: &Path, params: &ContextParams) -> Result<LlamaContext, ShimError> {
        let c_path =
            std::ffi::CString::new(model.as_os_str().as_encoded_bytes()).map_err(|_| {
                ShimError::ModelPath {
                    path: model.to_path_buf(),
                }
            })?;
        let (_keys, pairs) = params.to_raw();
        let mut err = vec![0u8; 2048];
        // SAFETY: c_path is NUL-terminated, `pairs` holds pairs.len() settings whose keys point
        // into `_keys` (NUL-terminated, alive across the call), err is writable for err.len()
        // bytes; the shim copies what it needs and keeps no pointer to them.
        let handle = unsafe {
            (self.api.open)(
                c_path.as_ptr(),
                pairs.as_ptr(),
                pairs.len(),
                err.as_mut_ptr().cast(),
                err.len(),
            )
        };
        match NonNull::new(handle) {
            Some(handle) => {
                // SAFETY: handle is a live handle from kvaudit_shim_open.
                let n_vocab = unsafe { (self.api.n_vocab)(handle.as_ptr()) };
                Ok(LlamaContext {
                    api: self.api.clone(),
                    handle,
                    n_vocab,
                    pin: self.version.clone(),
                    seq_state_cap: 0,
                })
            }
            None => {
                let end = err.iter().position(|&b| b == 0).unwrap_or(err.len());
                let message = String::from_utf8_lossy(&err[..end]).trim_end().to_string();
                Err(ShimError::Open {
                    pin: self.version.clone(),
                    model: model.to_path_buf(),
                    message,
                })
            }
        }
    }
}

/// One model and context of one pin. Freed in `Drop`.
pub struct LlamaContext {
    api: Arc<raw::Api>,
    handle: NonNull<raw::Handle>,
    n_vocab: i32,
    pin: String,
    /// Capacity that held the largest per-sequence state so far: `state_seq_get` first tries
    /// one pass into a buffer this large and asks for the exact size only when it is too small.
    seq_state_cap: usize,
}

// SAFETY: a llama_context has no thread affinity: it may be used from any one thread at a
// time. `LlamaContext` is not `Sync` and all its methods take `&mut self` or only read
// constants, so it is never used from two threads at once.
unsafe impl Send for LlamaContext {}

impl std::fmt::Debug for LlamaContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlamaContext")
            .field("pin", &self.pin)
            .field("n_vocab", &self.n_vocab)
            .finish()
    }
}

impl Drop for LlamaContext {
    fn drop(&mut self) {
        // SAFETY: the handle came from kvaudit_shim_open and is closed exactly once, here.
        unsafe { (self.api.close)(self.handle.as_ptr()) }
    }
}

impl LlamaContext {
    #[inline]
    fn h(&self) -> *mut raw::Handle {
        self.handle.as_ptr()
    }

    /// Turns a negative shim status into a [`ShimError`].
    #[inline]
    fn check(&self, op: &'static str, code: i64) -> Result<i64, ShimError> {
        if code >= 0 {
            return Ok(code);
        }
        self.failed(op, code)
    }

    /// [`LlamaContext::check`]'s error, out of the way of the calls that succeed.
    #[cold]
    #[inline(never)]
    fn failed(&self, op: &'static str, code: i64) -> Result<i64, ShimError> {
        let log = self.api.last_error();
        Err(match code {
            raw::E_EXCEPTION => ShimError::Exception { op, log },
            raw::E_LLAMA => ShimError::NoData { op, log },
            _ => ShimError::Status { op, code, log },
        })
    }

    /// The pin label of the shim this context came from.
    pub fn pin(&self) -> &str {
        &self.pin
    }

    /// Size of the vocabulary.
    pub fn n_vocab(&self) -> i32 {
        self.n_vocab
    }

    /// Error-level log text llama.cpp emitted during the last call on this thread (e.g. why
    /// a decode returned -1).
    pub fn last_error(&self) -> String {
        self.api.last_error()
    }

    /// One `llama_decode`: token `i` goes to the sequences `seq_ids[i]`, at `positions[i]`, or,
    /// with `positions = None`, where llama.cpp's batch allocator puts it (after the
    /// sequence's `seq_pos_max`). Logits are requested for the last token. Returns
    /// llama_decode's return code (0 ok, 1 no KV slot, -1 invalid batch, ...); a caught C++
    /// exception is `Err`.
    pub fn decode(
        &mut self,
        tokens: &[i32],
        positions: Option<&[i32]>,
        seq_ids: &[&[i32]],
    ) -> Result<i32, ShimError> {
        let bad = |message: String| ShimError::BadArguments {
            op: "decode",
            message,
        };
        if seq_ids.len() != tokens.len() {
            return Err(bad(format!(
                "{} tokens but {} seq id sets",
                tokens.len(),
                seq_ids.len()
            )));
        }
        if let Some(p) = positions {
            if p.len() != tokens.len() {
                return Err(bad(format!(
                    "{} tokens but {} positions",
                    tokens.len(),
                    p.len()
                )));
            }
        }
        let n_tokens = i32::try_from(tokens.len()).map_err(|_| bad("too many tokens".into()))?;
        let mut n_seq_id = Vec::with_capacity(tokens.len());
        let mut flat = Vec::new();
        for set in seq_ids {
            n_seq_id.push(i32::try_from(set.len()).map_err(|_| bad("too many seq ids".into()))?);
            flat.extend_from_slice(set);
        }
        // Never hand the shim a NULL array for a non-empty batch.
        if flat.is_empty() {
            flat.push(0);
        }
        // SAFETY: every array holds n_tokens entries (flat: the sum of n_seq_id, at least one),
        // and all outlive the call; the shim and llama.cpp only read them during it.
        let rc = unsafe {
            (self.api.decode)(
                self.h(),
                n_tokens,
                tokens.as_ptr(),
                positions.map_or(std::ptr::null(), <[i32]>::as_ptr),
                n_seq_id.as_ptr(),
                flat.as_ptr(),
                1,
            )
        };
        if i64::from(rc) <= raw::E_NULL && i64::from(rc) >= -1999 {
            self.check("decode", i64::from(rc))?;
        }
        Ok(rc)
    }

    /// `llama_memory_seq_rm(seq_id, p0, p1)`: whether llama.cpp removed the range.
    #[inline]
    pub fn seq_rm(&mut self, seq_id: i32, p0: i32, p1: i32) -> Result<bool, ShimError> {
        // SAFETY: live handle; plain integers.
        let rc = unsafe { (self.api.seq_rm)(self.h(), seq_id, p0, p1) };
        Ok(self.check("seq_rm", i64::from(rc))? != 0)
    }

    /// `llama_memory_seq_cp(src, dst, p0, p1)`.
    #[inline]
    pub fn seq_cp(&mut self, src: i32, dst: i32, p0: i32, p1: i32) -> Result<(), ShimError> {
        // SAFETY: live handle; plain integers.
        let rc = unsafe { (self.api.seq_cp)(self.h(), src, dst, p0, p1) };
        self.check("seq_cp", i64::from(rc)).map(drop)
    }

    /// `llama_memory_seq_keep(seq_id)`.
    #[inline]
    pub fn seq_keep(&mut self, seq_id: i32) -> Result<(), ShimError> {
        // SAFETY: live handle; plain integers.
        let rc = unsafe { (self.api.seq_keep)(self.h(), seq_id) };
        self.check("seq_keep", i64::from(rc)).map(drop)
    }

    /// `llama_memory_seq_add(seq_id, p0, p1, delta)`.
    #[inline]
    pub fn seq_add(&mut self, seq_id: i32, p0: i32, p1: i32, delta: i32) -> Result<(), ShimError> {
        // SAFETY: live handle; plain integers.
        let rc = unsafe { (self.api.seq_add)(self.h(), seq_id, p0, p1, delta) };
        self.check("seq_add", i64::from(rc)).map(drop)
    }

    /// `llama_memory_seq_div(seq_id, p0, p1, d)`. `d = 0` aborts inside llama.cpp.
    #[inline]
    pub fn seq_div(&mut self, seq_id: i32, p0: i32, p1: i32, d: i32) -> Result<(), ShimError> {
        // SAFETY: live handle; plain integers.
        let rc = unsafe { (self.api.seq_div)(self.h(), seq_id, p0, p1, d) };
        self.check("seq_div", i64::from(rc)).map(drop)
    }

    /// `llama_memory_clear(data)`.
    #[inline]
    pub fn clear(&mut self, data: bool) -> Result<(), ShimError> {
        // SAFETY: live handle; plain integers.
        let rc = unsafe { (self.api.clear)(self.h(), i32::from(data)) };
        self.check("clear", i64::from(rc)).map(drop)
    }

    /// `llama_memory_seq_pos_min(seq_id)`; -1 for an empty sequence.
    #[inline]
    pub fn seq_pos_min(&mut self, seq_id: i32) -> Result<i32, ShimError> {
        let mut out = 0;
        // SAFETY: live handle; `out` is writable for one i32.
        let rc = unsafe { (self.api.seq_pos_min)(self.h(), seq_id, &mut out) };
        self.check("seq_pos_min", i64::from(rc))?;
        Ok(out)
    }

    /// `llama_memory_seq_pos_max(seq_id)`; -1 for an empty sequence.
    #[inline]
    pub fn seq_pos_max(&mut self, seq_id: i32) -> Result<i32, ShimError> {
        let mut out = 0;
        // SAFETY: live handle; `out` is writable for one i32.
        let rc = unsafe { (self.api.seq_pos_max)(self.h(), seq_id, &mut out) };
        self.check("seq_pos_max", i64::from(rc))?;
        Ok(out)
    }

    /// `llama_state_seq_get_data(seq_id)`: the serialized cells of one sequence (format
    /// [`LlamaShim::state_seq_format`]; starts with the magic 0xaf143cd8).
    pub fn state_seq_get(&mut self, seq_id: i32) -> Result<Vec<u8>, ShimError> {
        let mut buf = Vec::new();
        self.state_seq_get_into(seq_id, &mut buf)?;
        Ok(buf)
    }

    /// [`LlamaContext::state_seq_get`] into `buf` (its bytes replaced; its allocation kept
    /// where large enough).
    pub fn state_seq_get_into(&mut self, seq_id: i32, buf: &mut Vec<u8>) -> Result<(), ShimError> {
        buf.clear();
        // One serialization pass instead of two (size, then data) when a buffer of the largest
        // size seen so far is enough; llama.cpp writes nothing and returns 0 when it is not.
        if self.seq_state_cap > 0 {
            // Not zeroed: llama.cpp writes the bytes it reports, and only those are kept.
            buf.reserve(self.seq_state_cap);
            // SAFETY: buf owns capacity() writable bytes, and the shim writes at most that many.
            let n = unsafe {
                (self.api.state_seq_get)(self.h(), seq_id, buf.as_mut_ptr(), buf.capacity())
            };
            let n = self.check("state_seq_get", n)? as usize;
            if n > 0 && n <= buf.capacity() {
                // SAFETY: the shim initialized the first n bytes (its return value), n <= capacity.
                unsafe { buf.set_len(n) };
                return Ok(());
            }
        }
        // SAFETY: live handle; plain integers.
        let size = unsafe { (self.api.state_seq_size)(self.h(), seq_id) };
        let size = self.check("state_seq_size", size)? as usize;
        buf.resize(size, 0);
        // SAFETY: buf is writable for buf.len() bytes, and the shim writes at most that many.
        let n = unsafe { (self.api.state_seq_get)(self.h(), seq_id, buf.as_mut_ptr(), buf.len()) };
        let n = self.check("state_seq_get", n)? as usize;
        if n == 0 && size > 0 {
            return Err(ShimError::NoData {
                op: "state_seq_get",
                log: self.api.last_error(),
            });
        }
        buf.truncate(n);
        self.seq_state_cap = self.seq_state_cap.max(size);
        Ok(())
    }

    /// `llama_state_get_data`: the whole context state (all sequences, outputs, ...).
    pub fn state_get(&mut self) -> Result<Vec<u8>, ShimError> {
        // SAFETY: live handle.
        let size = unsafe { (self.api.state_size)(self.h()) };
        let size = self.check("state_size", size)? as usize;
        let mut buf = vec![0u8; size];
        // SAFETY: buf is writable for buf.len() bytes, and the shim writes at most that many.
        let n = unsafe { (self.api.state_get)(self.h(), buf.as_mut_ptr(), buf.len()) };
        let n = self.check("state_get", n)? as usize;
        if n == 0 && size > 0 {
            return Err(ShimError::NoData {
                op: "state_get",
                log: self.api.last_error(),
            });
        }
        buf.truncate(n);
        Ok(buf)
    }

    /// `llama_state_set_data`: restores a state from [`LlamaContext::state_get`]. `Err` when
    /// llama.cpp rejects it or reads fewer bytes than given.
    #[inline]
    pub fn state_set(&mut self, state: &[u8]) -> Result<(), ShimError> {
        // SAFETY: state is readable for state.len() bytes during the call.
        let n = unsafe { (self.api.state_set)(self.h(), state.as_ptr(), state.len()) };
        let n = self.check("state_set", n)? as usize;
        if n != state.len() {
            return Err(ShimError::NoData {
                op: "state_set",
                log: format!(
                    "read {n} of {} bytes: {}",
                    state.len(),
                    self.api.last_error()
                ),
            });
        }
        Ok(())
    }

    /// `llama_state_seq_get_data(seq_id)`, or `llama_state_seq_get_data_ext(seq_id, flags)` when
    /// `flags != 0`, as a save op sees it: the bytes llama.cpp wrote, empty when it wrote none
    /// (not an error: the op reports it).
    pub fn state_seq_save(&mut self, seq_id: i32, flags: u32) -> Result<Vec<u8>, ShimError> {
        // SAFETY: live handle; plain integers.
        let size = unsafe {
            if flags == 0 {
                (self.api.state_seq_size)(self.h(), seq_id)
            } else {
                (self.api.state_seq_size_ext)(self.h(), seq_id, flags)
            }
        };
        let size = self.check("state_seq_size", size)? as usize;
        let mut buf = vec![0u8; size];
        // SAFETY: buf is writable for buf.len() bytes, and the shim writes at most that many.
        let n = unsafe {
            if flags == 0 {
                (self.api.state_seq_get)(self.h(), seq_id, buf.as_mut_ptr(), buf.len())
            } else {
                (self.api.state_seq_get_ext)(self.h(), seq_id, buf.as_mut_ptr(), buf.len(), flags)
            }
        };
        let n = self.check("state_seq_get", n)? as usize;
        buf.truncate(n);
        Ok(buf)
    }

    /// `llama_state_seq_set_data(bytes, seq_id)`, or `llama_state_seq_set_data_ext(.., flags)`
    /// when `flags != 0`: the number of bytes llama.cpp read (0: it rejected them).
    pub fn state_seq_load(
        &mut self,
        seq_id: i32,
        bytes: &[u8],
        flags: u32,
    ) -> Result<usize, ShimError> {
        // SAFETY: bytes is readable for bytes.len() bytes during the call; nothing is kept.
        let n = unsafe {
            if flags == 0 {
                (self.api.state_seq_set)(self.h(), seq_id, bytes.as_ptr(), bytes.len())
            } else {
                (self.api.state_seq_set_ext)(self.h(), seq_id, bytes.as_ptr(), bytes.len(), flags)
            }
        };
        Ok(self.check("state_seq_set", n)? as usize)
    }

    /// `llama_state_get_data` as a save op sees it: the bytes written, empty when none were.
    pub fn state_save(&mut self) -> Result<Vec<u8>, ShimError> {
        // SAFETY: live handle.
        let size = unsafe { (self.api.state_size)(self.h()) };
        let size = self.check("state_size", size)? as usize;
        let mut buf = vec![0u8; size];
        // SAFETY: buf is writable for buf.len() bytes, and the shim writes at most that many.
        let n = unsafe { (self.api.state_get)(self.h(), buf.as_mut_ptr(), buf.len()) };
        let n = self.check("state_get", n)? as usize;
        buf.truncate(n);
        Ok(buf)
    }

    /// The size a dump's size call reports and the bytes its data call writes into a buffer of
    /// that size: the whole context (`seq_id` `None`: `llama_state_get_size` /
    /// `llama_state_get_data`), or one sequence with `flags` (`llama_state_seq_get_size(_ext)` /
    /// `llama_state_seq_get_data(_ext)`). The sizes are measured as they are, never corrected.
    pub fn state_dump_size(
        &mut self,
        seq_id: Option<i32>,
        flags: u32,
    ) -> Result<(usize, usize), ShimError> {
        // SAFETY: live handle; plain integers.
        let size = unsafe {
            match seq_id {
                None => (self.api.state_size)(self.h()),
                Some(seq) if flags == 0 => (self.api.state_seq_size)(self.h(), seq),
                Some(seq) => (self.api.state_seq_size_ext)(self.h(), seq, flags),
            }
        };
        let size = self.check("state_size", size)? as usize;
        let mut buf = vec![0u8; size];
        // SAFETY: buf is writable for buf.len() bytes, and the shim writes at most that many.
        let n = unsafe {
            match seq_id {
                None => (self.api.state_get)(self.h(), buf.as_mut_ptr(), buf.len()),
                Some(seq) if flags == 0 => {
                    (self.api.state_seq_get)(self.h(), seq, buf.as_mut_ptr(), buf.len())
                }
                Some(seq) => {
                    (self.api.state_seq_get_ext)(self.h(), seq, buf.as_mut_ptr(), buf.len(), flags)
                }
            }
        };
        let n = self.check("state_get", n)? as usize;
        Ok((size, n))
    }

    /// `llama_state_set_data(bytes)` as a load op sees it: the number of bytes read (0:
    /// rejected). Unlike [`LlamaContext::state_set`], a rejection is a value, not an error.
    pub fn state_load(&mut self, bytes: &[u8]) -> Result<usize, ShimError> {
        // SAFETY: bytes is readable for bytes.len() bytes during the call; nothing is kept.
        let n = unsafe { (self.api.state_set)(self.h(), bytes.as_ptr(), bytes.len()) };
        Ok(self.check("state_set", n)? as usize)
    }

    /// `llama_n_ctx`: the context size after llama.cpp's padding.
    pub fn n_ctx(&mut self) -> Result<u32, ShimError> {
        // SAFETY: live handle.
        let n = unsafe { (self.api.n_ctx)(self.h()) };
        Ok(self.check("n_ctx", n)? as u32)
    }

    /// `llama_n_seq_max`.
    pub fn n_seq_max(&mut self) -> Result<u32, ShimError> {
        // SAFETY: live handle.
        let n = unsafe { (self.api.n_seq_max)(self.h()) };
        Ok(self.check("n_seq_max", n)? as u32)
    }

    /// `llama_n_batch`.
    pub fn n_batch(&mut self) -> Result<u32, ShimError> {
        // SAFETY: live handle.
        let n = unsafe { (self.api.n_batch)(self.h()) };
        Ok(self.check("n_batch", n)? as u32)
    }

    /// `llama_n_ubatch`.
    pub fn n_ubatch(&mut self) -> Result<u32, ShimError> {
        // SAFETY: live handle.
        let n = unsafe { (self.api.n_ubatch)(self.h()) };
        Ok(self.check("n_ubatch", n)? as u32)
    }

    /// The value `key` has in this context, read back through llama.h where llama.h can tell
    /// (`llama_n_ctx`, `llama_n_seq_max`, `llama_n_batch`, `llama_n_ubatch`, `llama_n_threads`),
    /// else as the shim passed it to `llama_init_from_model`; in the shim's encoding
    /// ([`ContextParams`]). `None` for a key the shim cannot read back.
    pub fn setting_value(&mut self, key: &str) -> Result<Option<i64>, ShimError> {
        let name = std::ffi::CString::new(key).expect("key names have no NUL");
        let mut out = 0i64;
        // SAFETY: live handle, NUL-terminated key, `out` is writable.
        let rc = unsafe { (self.api.setting_value)(self.h(), name.as_ptr(), &mut out) };
        match i64::from(rc) {
            raw::E_LLAMA => Ok(None),
            rc => self.check("setting_value", rc).map(|_| Some(out)),
        }
    }

    /// The model's `general.architecture`, through `llama_model_meta_val_str`.
    pub fn model_arch(&mut self) -> Result<String, ShimError> {
        let f = self.api.model_arch;
        self.text("model_arch", 64, f)
    }

    /// What `llama_init_from_model` logged about the memory it allocated, as it logged it
    /// (`kvaudit_shim_memory_log`: each cache's `size = ... (N cells, L layers, S/T seqs)` line
    /// and the composite memories' `creating ... KV cache` lines). Parsed by
    /// kvaudit (`src/targets/llama/memory_log.rs`).
    pub fn memory_log(&mut self) -> Result<String, ShimError> {
        let f = self.api.memory_log;
        self.text("memory_log", 4096, f)
    }

    /// The text a shim call of the `(handle, buf, cap) -> full length` shape writes into a
    /// buffer of `cap` bytes (NUL included; a longer text is cut).
    fn text(
        &mut self,
        what: &'static str,
        cap: usize,
        f: raw::TextFn,
    ) -> Result<String, ShimError> {
        let mut buf = vec![0u8; cap];
        // SAFETY: live handle; buf is writable for buf.len() bytes, NUL included, which is
        // what every function of this shape writes at most.
        let n = unsafe { f(self.h(), buf.as_mut_ptr().cast(), buf.len()) };
        let n = self.check(what, i64::from(n))? as usize;
        buf.truncate(n.min(buf.len() - 1));
        Ok(String::from_utf8_lossy(&buf).into_owned())
    }

    /// The logits of the last output of the last decode (`llama_get_logits_ith(-1)`).
    pub fn logits_last(&mut self) -> Result<Vec<f32>, ShimError> {
        let n = usize::try_from(self.n_vocab).unwrap_or(0);
        let mut out = vec![0f32; n];
        // SAFETY: out is writable for n_vocab floats, which is what cap says.
        let rc = unsafe { (self.api.get_logits_ith)(self.h(), -1, out.as_mut_ptr(), self.n_vocab) };
        self.check("get_logits_ith", i64::from(rc))?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_setting_is_one_pair_of_sixteen_bytes() {
        // `kvaudit_shim_setting` is a pointer and an int64_t: the C side reads the array so.
        assert_eq!(std::mem::size_of::<raw::Setting>(), 16);
    }

    #[test]
    fn params_keep_their_order_and_replace_in_place() {
        let params = ContextParams::default()
            .with("n_ctx", 256)
            .with("type_k", 1)
            .with("n_ctx", 512);
        let (keys, pairs) = params.to_raw();
        let names: Vec<&str> = keys.iter().map(|k| k.to_str().unwrap()).collect();
        assert_eq!(names, ["n_ctx", "type_k"]);
        assert_eq!(pairs[0].value, 512);
        assert_eq!(params.get("type_k"), Some(1));
        assert_eq!(params.get("n_batch"), None);
    }

    #[test]
    fn error_codes_match_the_header() {
        let header = super::super::shim::SHIM_HEADER;
        for (name, value) in [
            ("KVAUDIT_SHIM_E_NULL", raw::E_NULL),
            ("KVAUDIT_SHIM_E_EXCEPTION", raw::E_EXCEPTION),
            ("KVAUDIT_SHIM_E_BUFFER", raw::E_BUFFER),
            ("KVAUDIT_SHIM_E_LLAMA", raw::E_LLAMA),
        ] {
            assert!(
                header.contains(&format!("#define {name} ({value})")),
                "{name}"
            );
        }
    }

    #[test]
    fn loading_a_missing_library_is_an_error() {
        let err = LlamaShim::load(Path::new("/nonexistent/libkvaudit_shim.so")).unwrap_err();
        assert!(format!("{err:#}").contains("/nonexistent/libkvaudit_shim.so"));
    }
}
