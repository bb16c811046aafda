//! `kvaudit corpus`: what the regression corpus holds beside its repro files. `decisions` prints
//! the decision tables (`kvaudit::outputs::decisions::markdown`) that `docs/results.md` holds
//! between its markers, or the root causes as JSON.

use clap::{Args, Subcommand, ValueEnum};

use super::CliError;
use kvaudit::base::exit;
use kvaudit::outputs::corpus::Corpus;
use kvaudit::outputs::decisions::{markdown, root_causes};

/// Arguments of `kvaudit corpus`.
#[derive(Debug, Args)]
pub struct CorpusCmd {
    #[command(subcommand)]
    what: CorpusWhat,
}

#[derive(Debug, Subcommand)]
enum CorpusWhat {
    /// The decisions of the corpus, one row per root cause, a table per decision word.
    Decisions {
        /// Markdown tables (as in docs/results.md) or JSON.
        #[arg(long, value_enum, default_value_t = Format::Markdown)]
        format: Format,
        /// The corpus (default: the one built in).
        #[arg(long)]
        corpus: Option<std::path::PathBuf>,
    },
}

/// How `decisions` prints.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum Format {
    Markdown,
    Json,
}

/// Runs `kvaudit corpus ...`.
pub fn run(c: CorpusCmd) -> Result<i32, CliError> {
    match c.what {
        CorpusWhat::Decisions { format, corpus } => {
            let corpus = Corpus::from_flag(corpus.as_deref()).map_err(CliError::usage)?;
            match format {
                Format::Markdown => print!("{}", markdown(&corpus)),
                Format::Json => println!(
                    "{}",
                    serde_json::to_string_pretty(&root_causes(&corpus))
                        .expect("decisions serialize")
                ),
            }
            Ok(exit::CLEAN)
        }
    }
}
