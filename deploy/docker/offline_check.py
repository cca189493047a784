"""Build-time proof that the image starts offline (deploy/Dockerfile runs it; so does
tests/test_deploy_compose.py): loads the bundled policy and the packaged all-MiniLM-L6-v2
embedder with the Hugging Face hub switched off, and encodes one sentence. With the onnx
backend this also exports the int8 model into ``$SWITCHYARD_HOME/models`` so that containers
do not pay for the export at start-up.

    python deploy/docker/offline_check.py [SWITCHYARD_HOME]
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"


def main() -> int:
    home = Path(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("SWITCHYARD_HOME", "."))
    from gateway.cache.embedder import load_embedder
    from gateway.config.loader import load_policy
    from gateway.config.settings import default_policy_path

    policy = load_policy(default_policy_path())
    embedder = load_embedder(os.environ.get("SWITCHYARD_EMBEDDER", "auto"), home)
    vectors = embedder.encode(["does this container start without the network?"])
    if vectors.shape != (1, embedder.dim):
        print(f"offline check: unexpected embedding shape {vectors.shape}", file=sys.stderr)
        return 1
    print(f"offline check ok: {len(policy.routes)} routes, embedder {embedder.name} ({embedder.dim} dims)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
