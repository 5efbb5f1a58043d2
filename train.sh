#!/usr/bin/env bash
# Launch training through accelerate. Usage: ./train.sh [CONFIG] [--option value ...]
#   CONFIG defaults to config/config.json; each --option overrides that config.json option.
#   CONFIG_PATH=...              same as the argument
#   ACCELERATE_CONFIG_FILE=...   use this accelerate config instead of choosing flags here
#   ACCELERATE_EXTRA_ARGS="..."  passed through to accelerate launch (multi-node: --num_machines,
#                                --machine_rank, --main_process_ip, --main_process_port)
# With no CONFIG the built-in demo runs, generating its small dataset first when missing.
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
    launch_args+=(--num_machines 1 --dynamo_backend no --mixed_precision no)
    if ! python -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
        # On CPU, '--cpu --num_processes N' silently starts one process; gloo needs --multi_gpu.
        export ACCELERATE_USE_CPU=true
    fi
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

exec accelerate launch "${launch_args[@]}" "${extra_args[@]}" -m simpletuner.train --config "$config" "${option_args[@]}"
