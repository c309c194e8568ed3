"""somatile.eval: what the numeric contract costs on real models, and the harness around it.

``somatile eval minilm|smollm2`` (:mod:`.cli`, :mod:`.minilm`, :mod:`.smollm2`), the docs/results.md writer
(:mod:`.results`), the shared report helpers (:mod:`.report`), the evaluation text (:mod:`.text`) and the job
layer that runs evaluation windows and board sweeps on a process pool or a Dask cluster (:mod:`.jobs`).
``somatile capture`` (:mod:`.onnx_capture`) takes the attention logits of a user's ONNX model into the files
calibration reads (tested on all-MiniLM-L6-v2 exported by :mod:`.onnx_minilm`).
``somatile demo`` (:mod:`.demo`, with the Soma tour of :mod:`.soma_demo`) walks through every layer once, from
MiniLM's logits to the tile RTL behind the firmware.
Nothing in ``somatile.model`` imports this package.
"""
