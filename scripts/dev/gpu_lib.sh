# Shared by the device scripts (sourced, after OUT and L are set): the 4B-shaped checkpoint, the
# kernel test's log once per call, and one line of `dory bench`.
need_4b() {
  [ -e /tmp/dory4b/config.json ] || python3 scripts/make_checkpoint.py --out /tmp/dory4b --preset 4b --quiet
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
