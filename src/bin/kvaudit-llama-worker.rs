//! The `kvaudit-llama-worker` binary: the child side of llama.cpp's crash isolation, started by
//! `kvaudit` (one per runner) and never by hand. All of it is the library's
//! `targets::llama::worker::entry`; this file only gives it a process and an allocator.

fn main() {
    std::process::exit(kvaudit::targets::llama::worker::entry::main());
}

// The worker allocates small observation vectors at a high rate, as the explorer does: the same
// allocator as `kvaudit`'s (see src/main.rs).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
