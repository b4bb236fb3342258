#!/usr/bin/env bash
# Fetch, here, the wheels benchmarks/gpu_session.sh installs on the GPU machine: what cramnas needs
# there that the machine's image lacks (its python3 3.12 has torch, transformers, tokenizers,
# safetensors, pandas, pyarrow, scikit-learn, scipy, rich, huggingface-hub ...;
# /work/.library/device/KINDS.md lists it), each pinned to the version this checkout's tests run
# with, none of torch or CUDA. Not Ray (its wheel alone is 75.6 MiB, over what a device call
# carries): the GPU machine runs studies with `search.run --executor local`. Not MLflow's server:
# its tracking client (mlflow-skinny) writes the SQLite store, read elsewhere by `mlflow ui`.
#
#   bash benchmarks/gpu_wheels.sh            # into .whl/ (add /.whl/ to .git/info/exclude), then
#                                            # run the device call with carry: [".whl", ".gpudata"]
#
# The device call carries at most 64 MiB in all: the script prints the wheels' total (21 MiB on
# 2026-12-06) and fails when it is over 40 MiB, leaving room for the data.
set -euo pipefail
cd "$(dirname "$0")/.."
dest="${1:-.whl}"
# datasets, optuna, mlflow-skinny with SQLAlchemy and Alembic (the SQLite store), and the needs the
# image lacks (Requires-Dist of each, walked: `pip download` with its dependencies, less the image's).
wheels=(
    datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
    optuna==5.1.0 alembic==1.20.1 sqlalchemy==2.1.9 mako==1.4.3 colorlog==6.12.0 tzdata==2026.6
    mlflow-skinny==3.17.2 cachetools==7.3.3 databricks-sdk==0.167.0 google-auth==2.63.1 pyasn1==0.6.5
    pyasn1-modules==0.4.2 cryptography==51.0.1 cffi==2.1.1 pycparser==3.12 fastapi==0.165.0 starlette==1.10.0
    uvicorn==0.55.0 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
    gitpython==3.2.1 gitdb==4.0.12 smmap==5.0.3 importlib-metadata==9.1.0 opentelemetry-api==1.45.2
    opentelemetry-sdk==1.45.2 opentelemetry-proto==1.45.2 opentelemetry-semantic-conventions==0.66b2
    python-dotenv==1.2.4 sqlparse==0.6.1 httpx2==2.17.0 httpcore2==2.17.0 truststore==0.10.5
)
platforms=()
for tag in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
    platforms+=(--platform "$tag")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" -d "$dest" "${wheels[@]}"
if compgen -G "$dest/torch-*.whl" >/dev/null || compgen -G "$dest/nvidia_*.whl" >/dev/null; then
    echo "error: $dest holds torch or a CUDA wheel: the GPU image's own must be used; delete it" >&2
    exit 1
fi
total=$(du -cm "$dest"/*.whl | tail -1 | cut -f1)
echo "$dest: $(ls "$dest"/*.whl | wc -l) wheels, $total MiB"
if [ "$total" -gt 40 ]; then
    echo "error: $total MiB of wheels: too much to carry beside the data (64 MiB in all a call)" >&2
    exit 1
fi
