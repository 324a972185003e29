# Shared by the device scripts (sourced, after OUT and L are set): the 4B-shaped checkpoint, the
# kernel test's log once per call, and one line of `dory bench`.
need_4b() {
  [ -e /tmp/dory4b/config.json ] || python3 scripts/make_checkpoint.py --out /tmp/dory4b --preset 4b --quiet
}
# need_4b_as TYPE: the 4B checkpoint as TYPE (q8_0, q4_k_m, ...: GGUF; q8_2f: CMF), written
# once a machine; prints its path.
need_4b_as() {
  need_4b
  local ext=gguf cmd=quantize
  [ "$1" = q8_2f ] && ext=cmf cmd=convert
  local f=/tmp/dory4b-$1.$ext
  [ -f "$f" ] || build/dory $cmd /tmp/dory4b "$f" --type "$1" -q
  echo "$f"
}
need_kernel_test() {
  [ -e "$OUT/kernels.txt" ] || timeout 150 build/tests/test_cuda_kernels > "$OUT/kernels.txt" 2>&1
}
# bench_line LABEL "VAR=VALUE ..." ARGS...: `dory bench --device cuda ARGS` with those variables
# set, its pp or tg row (or its error) after LABEL, appended to $L.
bench_line() {
  local label=$1 vars=$2
  shift 2
  # shellcheck disable=SC2086  # the variables, one word each
  echo "$label $(env $vars build/dory bench --device cuda "$@" 2>&1 | grep -E '\| (pp|tg)|rror')" | tee -a "$L"
}
