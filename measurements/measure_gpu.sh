#!/usr/bin/env bash
# Measure this machine's GPU from a checkout, with a Python that has torch but perhaps not
# gpusim's other needs (the project's lent GPU machines have torch, numpy and matplotlib
# only). Missing packages are installed from wheels carried in .whl/ (see README.md here).
#
#   measurements/measure_gpu.sh DEVICE OUT_DIR "SUITE[:MINUTES] ..." [extra measure flags]
#   e.g. measurements/measure_gpu.sh h100-sxm "$OUT" "micro:4 models:5"
#
# Writes OUT_DIR/DEVICE/<suite>.json, OUT_DIR/DEVICE/measure.log and nvidia-smi's report.
set -uo pipefail
device=$1 out=$2 suites=$3
shift 3
here=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out/$device"
log="$out/$device/measure.log"
if ! python3 -c "import pydantic, simpy, yaml, rich" 2>/dev/null; then
    site=$(mktemp -d)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$site" "$here"/.whl/*.whl || { echo "no usable wheels in .whl/" >&2; exit 1; }
    export PYTHONPATH=$site
fi
export PYTHONPATH=$here${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi -q > "$out/$device/nvidia-smi.txt" 2>&1 || true
status=0
for entry in $suites; do
    suite=${entry%%:*}
    limit=()
    [[ $entry == *:* ]] && limit=(--max-minutes "${entry#*:}")
    python3 -m gpusim measure --suite "$suite" --out "$out/$device" --device "$device" \
        "${limit[@]}" "$@" 2>&1 | tee -a "$log" | grep -v '^\[' || status=1
done
exit $status
