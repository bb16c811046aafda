//! The `kvaudit` binary: glue over the library (see `kvaudit --help`).

mod cli;

use clap::Parser;

fn main() {
    kvaudit::targets::llama::startup::mark("kvaudit: main");
    quiet_on_closed_stdout();
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

/// `kvaudit oracles | head -3` closes stdout early: `println!` then panics with "failed printing
/// to stdout". The usual cure, restoring SIGPIPE's default action, would also kill an audit whose
/// worker child died while the parent writes its request (crash isolation depends on seeing EPIPE
/// there as an error), so instead the panic of a print to a closed pipe ends the process quietly,
/// with the status a shell gives a process killed by SIGPIPE (128 + 13).
fn quiet_on_closed_stdout() {
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if message.starts_with("failed printing to stdout")
            && message.contains(&std::io::Error::from_raw_os_error(libc::EPIPE).to_string())
        {
            std::process::exit(141);
        }
        default_hook(info);
    }));
}

// The exhaustive explorer allocates small observation vectors at a high rate; mimalloc roughly
// halves the allocator's share of an audit (measured with `kvaudit bench`).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
