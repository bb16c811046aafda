//! The `kvaudit` binary: glue over the library (see `kvaudit --help`).

mod cli;

use clap::Parser;

fn main() {
    let cli = cli::Cli::parse();
    match cli::run(cli) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            // Messages quote inputs (file contents, target output): nothing in them may act on
            // the terminal, line breaks aside.
            let lines: Vec<String> = e
                .message
                .lines()
                .map(kvaudit::records::report::terminal_text)
                .collect();
            eprintln!("kvaudit: error: {}", lines.join("\n"));
            std::process::exit(e.code);
        }
    }
}

// The exhaustive explorer allocates small observation vectors at a high rate; mimalloc roughly
// halves the allocator's share of an audit (measured with `kvaudit bench`).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
