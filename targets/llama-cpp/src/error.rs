//! The errors of the llama.cpp target, one style for all of them (thiserror enums):
//!
//! - [`LlamaError`]: everything between a pin label and a loaded shim: pins, the host, the
//!   llama.cpp tree, `cargo fetch`, compiling and linking, the cache, and (as parts) the two
//!   below.
//! - [`ShimError`]: the loaded shim and its call protocol (library missing, ABI mismatch, NULL
//!   handle, an exception caught at the C boundary); what [`super::ffi`] returns.
//! - [`WireError`]: the worker's line protocol (a line too long, malformed, or naming a setup or
//!   op the request does not hold); what kvaudit's worker wire returns.
//!
//! Each message is complete on its own (paths, commands, exit codes, what the tool printed):
//! callers print them with `{e}` or `{e:#}` alike, and kvaudit's runner turns them into its
//! harness errors. A divergence of llama.cpp's cache is
//! never an error here: it is a value the oracles judge.
//!
//! This module sits below `build` and `ffi`, and imports neither.

use std::io;
use std::path::PathBuf;

/// Something between a pin label and a loaded shim broke.
#[derive(Debug, thiserror::Error)]
pub enum LlamaError {
    /// A pin label that names no known pin, or a malformed pins.toml.
    #[error("{message}")]
    Pin {
        /// What is wrong, with the label or the pins.toml key.
        message: String,
    },
    /// This machine cannot build or run the recipe (not x86-64 Linux, a CPU without AVX2, no
    /// cache directory).
    #[error("{message}")]
    Host {
        /// What is missing.
        message: String,
    },
    /// A llama.cpp tree that cannot be used (not a tree, unreadable, a symlink loop, no
    /// version in its CMake files, no sources where the recipe looks).
    #[error("{}: {message}", path.display())]
    Source {
        /// The tree, or the file in it.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// `cargo fetch` of a pin's crate failed.
    #[error("`cargo fetch` for {crate_name} {version}: {message}")]
    Fetch {
        /// The crate (`llama-cpp-sys-2`).
        crate_name: String,
        /// Its version.
        version: String,
        /// The exit status and what cargo printed.
        message: String,
    },
    /// A compile or link step could not run or failed inside the `cc` crate.
    #[error("{what}: {message}")]
    Compile {
        /// The step, e.g. `compiling ggml-cpu.c++`.
        what: String,
        /// The compiler's error and what it printed.
        message: String,
    },
    /// An external command (archiver, linker, `nm`) ran and failed.
    #[error("{what} failed ({status}):\n{output}")]
    Command {
        /// The step, e.g. `linking libkvaudit_shim.so`.
        what: String,
        /// The exit status.
        status: String,
        /// Its standard output and error.
        output: String,
    },
    /// A file-system operation failed.
    #[error("{what}: {error}")]
    Io {
        /// The operation and its path, e.g. `creating /root/.cache/kvaudit`.
        what: String,
        /// The system's error.
        error: io::Error,
    },
    /// The cache directory or one of its entries is unusable (wrong permissions, a manifest
    /// that does not parse or contradicts itself).
    #[error("{}: {message}", path.display())]
    Cache {
        /// The directory or file.
        path: PathBuf,
        /// What is wrong, and what to do about it.
        message: String,
    },
    /// A cache entry whose file no longer has the sha256 its manifest records: it is not
    /// loaded, and not silently rebuilt either.
    #[error(
        "{}: sha256 {actual}, but the cache entry's manifest records {recorded}: the entry changed \
         after it was built, refusing to use it (delete {} or run `kvaudit target build {pin} --force`)",
        file.display(),
        entry.display()
    )]
    Tampered {
        /// The changed file.
        file: PathBuf,
        /// Its entry directory.
        entry: PathBuf,
        /// The pin label of the entry.
        pin: String,
        /// sha256 the manifest records.
        recorded: String,
        /// sha256 of the file now.
        actual: String,
    },
    /// A fix (`+fix:NAME`) that is not known, does not parse, or does not apply to a pin's
    /// sources exactly.
    #[error("fix `{name}`: {message}")]
    Fix {
        /// The fix's name.
        name: String,
        /// What is wrong: for a patch that does not apply, the file and hunk.
        message: String,
    },
    /// A build failed; what failed is inside.
    #[error("building {pin}: {error}")]
    Building {
        /// The pin label.
        pin: String,
        /// The failure.
        error: Box<LlamaError>,
    },
    /// The shim could not be loaded or called.
    #[error(transparent)]
    Shim(#[from] ShimError),
    /// The worker's line protocol broke.
    #[error(transparent)]
    Wire(#[from] WireError),
}

impl LlamaError {
    /// An [`LlamaError::Io`] for `what` (an operation and its path).
    pub fn io(what: impl Into<String>, error: io::Error) -> LlamaError {
        LlamaError::Io {
            what: what.into(),
            error,
        }
    }
}

/// `.context_io(|| "creating DIR")` on `io::Result`: the operation and path go into the error.
pub trait IoContext<T> {
    /// Turns an `io::Error` into [`LlamaError::Io`] naming `what()`.
    fn context_io(self, what: impl FnOnce() -> String) -> Result<T, LlamaError>;
}

impl<T> IoContext<T> for io::Result<T> {
    fn context_io(self, what: impl FnOnce() -> String) -> Result<T, LlamaError> {
        self.map_err(|error| LlamaError::io(what(), error))
    }
}

/// A failure of the shim or of the call protocol (not a behaviour of llama.cpp's cache).
#[derive(Debug, thiserror::Error)]
pub enum ShimError {
    /// `dlopen` refused the library.
    #[error("loading {}: {message}", path.display())]
    Load {
        /// The library.
        path: PathBuf,
        /// The loader's message.
        message: String,
    },
    /// The library lacks a function of kvaudit_shim.h.
    #[error("{}: symbol {name} missing: {message}", path.display())]
    Symbol {
        /// The library.
        path: PathBuf,
        /// The C symbol.
        name: String,
        /// The loader's message.
        message: String,
    },
    /// The library's ABI number is not the one this kvaudit is written against.
    #[error("{}: shim ABI {found}, this kvaudit expects {expected}; rebuild it with `kvaudit target build <pin> --force`", path.display())]
    AbiMismatch {
        /// The library.
        path: PathBuf,
        /// What it reports.
        found: i32,
        /// [`super::shim::SHIM_ABI`].
        expected: u32,
    },
    /// The library was built for another pin than the caller expected.
    #[error("{}: built for {found}, expected {expected}", path.display())]
    WrongPin {
        /// The library.
        path: PathBuf,
        /// `kvaudit_shim_version()`.
        found: String,
        /// The expected label.
        expected: String,
    },
    /// A model path that C cannot take (it holds a NUL byte).
    #[error("model path {} contains a NUL byte", path.display())]
    ModelPath {
        /// The path.
        path: PathBuf,
    },
    /// `kvaudit_shim_open` returned NULL.
    #[error("opening {} with {pin}: {message}", model.display())]
    Open {
        /// The pin label.
        pin: String,
        /// The model path.
        model: PathBuf,
        /// llama.cpp's error log text.
        message: String,
    },
    /// llama.cpp threw a C++ exception, caught by the shim.
    #[error("{op}: llama.cpp threw a C++ exception (caught in the shim): {log}")]
    Exception {
        /// The shim function.
        op: &'static str,
        /// Error log text.
        log: String,
    },
    /// llama.cpp returned no data where the call needs some (NULL logits, 0 state bytes).
    #[error("{op}: llama.cpp returned no data: {log}")]
    NoData {
        /// The shim function.
        op: &'static str,
        /// Error log text.
        log: String,
    },
    /// Any other negative shim status.
    #[error("{op}: shim status {code}: {log}")]
    Status {
        /// The shim function.
        op: &'static str,
        /// The `KVAUDIT_SHIM_E_*` value.
        code: i64,
        /// Error log text.
        log: String,
    },
    /// The caller's arguments do not fit together (e.g. one seq set per token).
    #[error("{op}: {message}")]
    BadArguments {
        /// The safe method.
        op: &'static str,
        /// What is wrong.
        message: String,
    },
}

/// A line of the worker protocol that cannot be taken (see kvaudit's `targets::llama::worker::wire`).
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// A line or frame longer than its direction's limit; the reader stopped reading it there.
    #[error("{what} longer than the limit of {limit} bytes")]
    TooLong {
        /// `request` or `reply`.
        what: &'static str,
        /// The limit in force.
        limit: usize,
    },
    /// A line that is not the JSON of a request, or a frame that is not a reply.
    #[error("malformed {what} ({error}): {excerpt}")]
    Malformed {
        /// `request` or `reply`.
        what: &'static str,
        /// The decoder's message.
        error: String,
        /// The start of the line, lossily decoded.
        excerpt: String,
    },
    /// A reply frame of another wire version: the worker is another build of kvaudit.
    #[error(
        "reply frame of wire version {found}, this kvaudit reads version {expected} (the worker \
         executable is another build of kvaudit)"
    )]
    Version {
        /// The frame's version.
        found: u32,
        /// The version this side reads.
        expected: u32,
    },
    /// A well-formed request whose traces name a setup or op it does not hold.
    #[error("invalid request: {0}")]
    Invalid(String),
    /// A read or write on the pipe failed.
    #[error("{what}: {error}")]
    Io {
        /// The operation.
        what: &'static str,
        /// The system's error.
        error: io::Error,
    },
}
