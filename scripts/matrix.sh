#!/usr/bin/env bash
# Regenerates the committed version matrix in reports/matrix/: every corpus file on every pin of
# targets/llama-cpp/pins.toml (release builds), as Markdown and JSON, with each finding's first
# failing and first fixed version. The corpus files of other engines read `-` (not applicable):
# scripts/matrix-mlx.sh runs mlx-lm's over its versions. Pins that are not built yet are built first, one after another
# (3 to 8 minutes each on 2 cores, 50 pins: a long run; `nice -n 19` keeps the machine usable).
#
#   scripts/matrix.sh                  every pin (builds what is missing)
#   scripts/matrix.sh --built-only     only the pins the cache already holds (builds nothing)
#   scripts/matrix.sh --targets 0.1.150..0.1.161    a range
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release
mkdir -p reports/matrix
# Exit 3 means some cell could not be judged (a pin that does not build): the table says which.
nice -n 19 ./target/release/kvaudit matrix corpora/ "$@" \
  --markdown reports/matrix/corpus.md --json reports/matrix/corpus.json || [ $? -eq 3 ]
