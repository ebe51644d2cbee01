#!/usr/bin/env bash
# One pass of every GPU check on a GPU machine (issues #15 and #34 Part B), within a fixed time budget
# (about 6 minutes; at most 8).
#
#   bash tools/gpu/run_checks.sh [LOGDIR]      (from the repository root, after gpu_check/build.sh)
#
# Order: the latency-bound Allreduce benchmark alone; then every package's CPU suite (niced) beside
# the GPU-bound benchmarks (the common row kernels: gather / scatter / scatter-add, one buffer and
# 8 chunks, with and without the index check, vs torch; wholemem gather and scatter of CHUNKED and
# DEVICE tables; cross-entropy, with its 3-passes-at-copy-bandwidth row); then the `gpu` suite and
# compute-sanitizer (memcheck: row kernels, Embedding optimizers and the cross-entropy's 16-byte
# vector cuts; racecheck: cross-entropy). Every step has its own deadline, so one hang costs only
# its own step. Logs and BENCH json land in LOGDIR (default /tmp/gpu_logs); SUMMARY lists each
# step's exit code (124 = its deadline).
set -uo pipefail
ROOT=$(pwd)
LOG=${1:-/tmp/gpu_logs}
mkdir -p "$LOG"
. "$ROOT/gpu_check/env.sh"
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
# the MPI backing folder nox would make (Open MPI 5 leaves segments in /dev/shm otherwise)
export OMPI_MCA_btl_sm_backing_directory=$(mktemp -d /dev/shm/dk-mpi-XXXX)
export OMPI_MCA_osc_sm_backing_directory=$OMPI_MCA_btl_sm_backing_directory
PY=${PY:-python3}
PYTEST=("$PY" -m pytest -c "$ROOT/pyproject.toml" --rootdir "$ROOT" -p no:cacheprovider)
SUMMARY=$LOG/SUMMARY
T0=$SECONDS

step() {  # step NAME SECONDS CMD...: run with a deadline, log to LOG/NAME.log, record the exit code
  local name=$1 secs=$2; shift 2
  local t=$SECONDS
  timeout -k 5 "$secs" "$@" > "$LOG/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc $((SECONDS - t))s" >> "$SUMMARY"
  return $rc
}

{
  date -u; uname -a; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))'
  command -v compute-sanitizer && compute-sanitizer --version | tail -1
  nproc; free -g | head -2
} > "$LOG/machine.txt" 2>&1

# -- 1. benchmarks: the latency-bound Allreduce alone, then the GPU-bound two beside the CPU suites --
B=$ROOT/packages
step bench_allreduce 60 mpiexec -n 2 "$PY" -m mpi4py "$B/mpiad/benchmarks/bench_allreduce_cuda.py" \
  --json "$LOG/bench_allreduce.json"
cd "$(mktemp -d)"  # nothing imports from the source tree
for p in common wholemem shardlayers distx-fake mpiad kvps; do
  step "cpu_$p" 420 nice -n 10 "${PYTEST[@]}" -m "not gpu and not cluster" --timeout 300 -q "$B/$p/tests" &
done
step bench_rows 60 "$PY" "$B/common/benchmarks/bench_rows_gpu.py" --json "$LOG/bench_rows.json"
step bench_gather 100 "$PY" "$B/wholemem/benchmarks/bench_gather_gpu.py" --budget 95 --json "$LOG/bench_gather.json"
step bench_xent 60 "$PY" "$B/shardlayers/benchmarks/bench_cross_entropy_gpu.py" --json "$LOG/bench_xent.json"
echo "benchmarks done at $((SECONDS - T0))s" >> "$SUMMARY"

# -- 2. the gpu suite and the sanitizers, side by side (the CPU suites go on) ----------------------
step gpu_suite 300 "${PYTEST[@]}" -m gpu -v --timeout 280 "$B"/*/tests &
SAN=(compute-sanitizer --target-processes all --error-exitcode 86 --print-limit 20)
PYTORCH_NO_CUDA_MEMORY_CACHING=1 step memcheck_rows 300 "${SAN[@]}" --tool memcheck \
  "${PYTEST[@]}" -v --timeout 290 "$B/common/tests/test_rows_cuda.py::test_cuda_row_kernels_match_the_cpu" &
PYTORCH_NO_CUDA_MEMORY_CACHING=1 step memcheck_embedding 300 "${SAN[@]}" --tool memcheck \
  "${PYTEST[@]}" -v --timeout 290 "$B/wholemem/tests/test_gpu_real.py::test_gpu_embedding_matches_cpu_for_every_optimizer" \
  "$B/wholemem/tests/test_gpu_real.py::test_device_tables_match_the_cpu_tables" &
step racecheck_xent 300 "${SAN[@]}" --tool racecheck \
  "${PYTEST[@]}" -v --timeout 290 "$B/shardlayers/tests/test_gpu.py::test_cuda_kernels_match_cpu_kernels" &
PYTORCH_NO_CUDA_MEMORY_CACHING=1 step memcheck_xent 300 "${SAN[@]}" --tool memcheck \
  "${PYTEST[@]}" -v --timeout 290 "$B/shardlayers/tests/test_gpu.py::test_cuda_vector_cuts_match_cpu_kernels" &
wait
echo "all done at $((SECONDS - T0))s" >> "$SUMMARY"
rm -rf "$OMPI_MCA_btl_sm_backing_directory"
cat "$SUMMARY"
