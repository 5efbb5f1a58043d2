#!/usr/bin/env bash
# Launch training through accelerate. Usage: ./train.sh [CONFIG] [--option value ...]
#   CONFIG defaults to config/config.json; each --option overrides that config.json option.
#   CONFIG_PATH=...              same as the argument
#   ACCELERATE_CONFIG_FILE=...   use this accelerate config instead of choosing flags here
#   ACCELERATE_EXTRA_ARGS="..."  passed through to accelerate launch (multi-node: --num_machines,
#                                --machine_rank, --main_process_ip, --main_process_port)
# With no CONFIG the built-in demo runs, generating its small dataset first when missing.
#
# Exit status: the training processes' own (0 trained, 1 failure, 2 configuration, 3 diverged,
# 75 preempted), or 128+N when signal N was forwarded and they ended without reporting one.
# SIGTERM, SIGINT and SIGUSR1 are forwarded once each to the training processes, which stop at
# the next step boundary; this script returns only once they are gone.
set -euo pipefail

config_given=""
if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then
    config_given="$1"
    shift
fi
option_args=("$@")  # --option value pairs, validated with the config
config="${config_given:-${CONFIG_PATH:-config/config.json}}"
# Relative paths inside the config are read from the repository root, as SimpleTuner does;
# a config path given on the command line is taken from where the script was called.
if [ -n "$config_given" ] || [ -n "${CONFIG_PATH:-}" ]; then
    config="$(realpath -m -- "$config")"
fi
cd "$(dirname "$0")"
if [ -z "$config_given" ] && [ -z "${CONFIG_PATH:-}" ]; then
    python -m simpletuner.demo_data data/demo-shapes
fi

# Validate before starting the launcher: a config mistake prints only its report (exit 2).
num_processes=$(python -m simpletuner check --config "$config" "${option_args[@]}") || exit $?

launch_args=()
extra_args=(${ACCELERATE_EXTRA_ARGS:-})
if [ -n "${ACCELERATE_CONFIG_FILE:-}" ]; then
    launch_args+=(--config_file "$ACCELERATE_CONFIG_FILE")
else
    # Without CUDA the launcher sets ACCELERATE_USE_CPU (gloo needs --multi_gpu below).
    launch_args+=(--cpu-without-cuda --num_machines 1 --dynamo_backend no --mixed_precision no)
    if [ "$num_processes" -gt 1 ]; then
        launch_args+=(--multi_gpu --num_processes "$num_processes")
        case " ${ACCELERATE_EXTRA_ARGS:-} " in
            *main_process_port*) ;;
            *) launch_args+=(--main_process_port 0) ;;
        esac
    else
        launch_args+=(--num_processes 1)
    fi
fi

# accelerate launch reports every failure as 1 (measured: 1 and N processes), so each training
# process leaves its own status in this folder (simpletuner/training/run/outcomes.py).
status_dir="$(mktemp -d "${TMPDIR:-/tmp}/simpletuner-status.XXXXXX")"
trap 'rm -rf "$status_dir"' EXIT
export SIMPLETUNER_EXIT_STATUS_DIR="$status_dir"

# Job control gives the launcher its own process group: a terminal's Ctrl-C reaches this script
# only (which forwards it once), and the launched processes do not start with SIGINT ignored.
set -m
# simpletuner.launch is accelerate launch without its traceback after a process's own report.
python -m simpletuner.launch "${launch_args[@]}" "${extra_args[@]}" -m simpletuner.train \
    --config "$config" "${option_args[@]}" &
launcher=$!
set +m

forwarded_signal=""
training_pids=()
forward() {
    # The training processes are the launcher's children. Signalling the launcher instead would
    # orphan them with 1 process (it dies) and, for SIGUSR1, with N (torchrun dies); torchrun
    # also gives them only 30 s after SIGTERM/SIGINT before SIGKILL.
    forwarded_signal=$1
    mapfile -t training_pids < <(pgrep -P "$launcher" || true)
    if [ ${#training_pids[@]} -eq 0 ]; then
        training_pids=("$launcher")  # not started yet: nothing to orphan
    fi
    echo "train.sh: forwarding SIG$1 to ${training_pids[*]}" >&2
    kill -s "$1" "${training_pids[@]}" 2>/dev/null || true
}
trap 'forward TERM' TERM
trap 'forward INT' INT
trap 'forward USR1' USR1

launcher_status=0
while :; do
    wait "$launcher" && launcher_status=0 || launcher_status=$?
    kill -0 "$launcher" 2>/dev/null || break  # still running: a trapped signal ended the wait
done
# Training processes reparented by a launcher that died first are waited for too (a zombie has
# ended: in a container its new parent may never collect it).
still_running() {
    local state
    state="$(ps -o stat= -p "$1")" && [[ "$state" != Z* ]]
}
for pid in "${training_pids[@]}"; do
    while still_running "$pid"; do sleep 1; done
done

run_status() {
    # The most serious status a training process reported; otherwise the launcher's, or the
    # forwarded signal's when it ended them before they could report.
    local reported
    reported="$(cat "$status_dir"/*.status 2>/dev/null || true)"
    for status in 1 3 2 75; do
        if grep -qx "$status" <<<"$reported"; then echo "$status"; return; fi
    done
    if [ "$launcher_status" -ne 0 ] && [ -z "$reported" ] && [ -n "$forwarded_signal" ]; then
        echo $((128 + $(kill -l "$forwarded_signal")))
    else
        echo "$launcher_status"
    fi
}
status="$(run_status)"
if [ "$status" -ne 0 ]; then
    echo "train.sh: training ended with exit status $status" >&2
fi
exit "$status"
