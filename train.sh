#!/usr/bin/env bash
# Launch training through accelerate. Usage: ./train.sh [CONFIG]   (default config/config.json)
#   CONFIG_PATH=...              same as the argument
#   ACCELERATE_CONFIG_FILE=...   use this accelerate config instead of choosing flags here
#   ACCELERATE_EXTRA_ARGS="..."  passed through to accelerate launch (multi-node: --num_machines,
#                                --machine_rank, --main_process_ip, --main_process_port)
# With no CONFIG the built-in demo runs, generating its small dataset first when missing.
set -euo pipefail

config="${1:-${CONFIG_PATH:-config/config.json}}"
# Relative paths inside the config are read from the repository root, as SimpleTuner does;
# a config path given on the command line is taken from where the script was called.
if [ $# -gt 0 ] || [ -n "${CONFIG_PATH:-}" ]; then
    config="$(realpath -m -- "$config")"
fi
cd "$(dirname "$0")"
if [ $# -eq 0 ] && [ -z "${CONFIG_PATH:-}" ]; then
    python -m simpletuner.demo_data data/demo-shapes
fi

num_processes=$(python - "$config" <<'PY'
import json, sys
try:
    with open(sys.argv[1], encoding="utf-8") as handle:
        options = json.load(handle)
    value = options.get("num_processes", options.get("--num_processes", 1))
    print(int(value) if isinstance(value, int) and value >= 1 else 1)
except (OSError, ValueError, AttributeError):
    print(1)  # training itself reports what is wrong with the file
PY
)

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

exec accelerate launch "${launch_args[@]}" "${extra_args[@]}" -m simpletuner.train --config "$config"
