# Sourced by the report scripts (attention-reports.sh, memtypes-reports.sh): `run NAME ARGS...`
# writes the JSON and Markdown reports of one `kvaudit audit ARGS` as $out/NAME.json and .md,
# with the binary $k. Exit code 1 (findings) is expected; any other failure stops the script.
run() {
  local name=$1; shift
  $k audit "$@" -q --out "$out/$name.json" >/dev/null || [ $? -eq 1 ]
  $k audit "$@" -q --format markdown --out "$out/$name.md" >/dev/null || [ $? -eq 1 ]
}
