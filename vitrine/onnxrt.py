"""Query-time forwards through onnxruntime: a torch module exported once, checked, then cached.

A search query is one short text (about 7 tokens) or one photo. At that size PyTorch's eager
dispatch, not arithmetic, is most of a forward: MiniLM's 6 layers take ~6 ms in eager mode on
one core and ~2 ms through onnxruntime's fused kernels (``vitrine bench fastpath``). So the query
path may run a module through onnxruntime:

- the module is exported with the TorchScript-based ONNX exporter (dynamic batch and length
  axes) into the cache dir, under a name that hashes the caller's model key, torch's and
  onnxruntime's versions: a new adapter, new towers or a new torch means a new export, never a
  stale graph;
- before it is used, the export is run on probe inputs next to the torch module and refused
  (:class:`~vitrine.errors.ModelError`) unless the outputs agree within ``atol``: a wrong graph
  must fail loudly at start-up, not rank badly; the caller then keeps torch;
- the file is written to a temporary name and renamed, so a crash never leaves half a graph.

The exported file is a derived, rebuildable cache (like the feature cache), not a model format:
the modules themselves persist as config.json + safetensors. onnxruntime is an optional extra
(``pip install 'vitrine[fast]'``); without it :func:`available` is False and callers keep torch.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch

from vitrine.atomic import atomic_path
from vitrine.errors import InvalidInput, MissingExtra, ModelError, VitrineError

log = logging.getLogger(__name__)

EXPORT_VERSION = 1  # bump when the export recipe changes: old cached graphs are then ignored
RUNTIMES = ("auto", "torch", "onnx")

T = TypeVar("T")


def available() -> bool:
    """Whether onnxruntime (and the ONNX exporter's ``onnx`` package) can be imported."""
    return importlib.util.find_spec("onnxruntime") is not None and importlib.util.find_spec("onnx") is not None


def _ort() -> Any:
    try:
        import onnxruntime
    except ImportError as e:
        raise MissingExtra("onnxruntime is not installed; pip install 'vitrine[fast]' (or set "
                           "VITRINE_QUERY_RUNTIME=torch)") from e
    return onnxruntime


def choose(runtime: str, what: str, build: Callable[[], T], *, obstacle: str | None = None) -> T | None:
    """What runs ``what`` (e.g. "query", "intent"): ``build()``'s onnxruntime graphs, or None for torch.

    ``runtime`` is torch (never builds), onnx (builds; raises :class:`~vitrine.errors.ModelError`
    when it cannot be had) or auto (builds when onnxruntime is installed, else torch; a build that
    fails is logged and torch kept; onnx without onnxruntime raises
    :class:`~vitrine.errors.MissingExtra`). ``obstacle``: why the caller's module cannot run in
    onnxruntime at all (the build is then not tried)."""
    if runtime not in RUNTIMES:
        raise InvalidInput(f"unknown {what} runtime {runtime!r}; use auto, torch or onnx")
    if runtime == "torch":
        return None
    why = obstacle
    if why is None and runtime == "auto" and not available():
        why = "onnxruntime is not installed (pip install 'vitrine[fast]')"
    if why is None:
        try:
            return build()
        except MissingExtra:
            if runtime == "onnx":
                raise  # the install hint, as is
            why = "onnxruntime is not installed (pip install 'vitrine[fast]')"
        except VitrineError as e:
            if runtime == "onnx":
                raise ModelError(f"{what} runtime onnx is not possible: {e}") from e
            log.warning("%s runs in torch: %s", what, e)
            return None
    if runtime == "onnx":
        raise ModelError(f"{what} runtime onnx is not possible: {why}")
    log.info("%s runs in torch: %s", what, why)
    return None


def eager_attention(config: Any) -> Callable[[], Callable[[], None]]:
    """An :meth:`OnnxModule.export` ``prepare`` for a transformers model with ``config``: attention
    written out while tracing (sdpa exports a different graph; the two agree to ~1e-6 in torch),
    switched back once exported and checked. transformers keeps a built model's attention kernel
    only in ``config._attn_implementation`` (``set_attn_implementation`` has no getter)."""

    def prepare() -> Callable[[], None]:
        old = getattr(config, "_attn_implementation", None)
        if config is None or old is None:
            return lambda: None
        config._attn_implementation = "eager"
        return lambda: setattr(config, "_attn_implementation", old)

    return prepare


class OnnxModule:
    """One exported module behind an onnxruntime session: ``module(*arrays) -> np.ndarray``."""

    def __init__(self, path: Path, input_names: Sequence[str], *, threads: int = 1) -> None:
        ort = _ort()
        so = ort.SessionOptions()
        so.intra_op_num_threads = max(1, int(threads))
        # idle pool threads sleep rather than spin: a server runs several sessions side by side on
        # few cores, and a spinning pool burns the cores the other requests need
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.log_severity_level = 3
        self.path = Path(path)
        self.input_names = list(input_names)
        self.session = ort.InferenceSession(str(self.path), so, providers=["CPUExecutionProvider"])

    def __call__(self, *inputs: np.ndarray) -> np.ndarray:
        # onnxruntime releases the GIL while it runs; one session serves concurrent callers.
        return self.session.run(None, dict(zip(self.input_names, inputs)))[0]

    @classmethod
    def export(
        cls,
        module: torch.nn.Module,
        example: Sequence[torch.Tensor],
        *,
        key: str,
        cache_dir: Path | None,
        input_names: Sequence[str],
        dynamic_axes: dict[str, dict[int, str]],
        probes: Sequence[Sequence[torch.Tensor]],
        atol: float = 1e-4,
        threads: int = 1,
        prepare: Callable[[], Callable[[], None]] | None = None,
    ) -> "OnnxModule":
        """Export ``module`` (or reuse the cached export for ``key``), check it on ``probes``
        against torch and return it. ``cache_dir``: where the graph is cached (None: the system's
        temporary directory). ``prepare`` may switch the module into an exportable mode and
        returns the function that switches it back."""
        ort = _ort()
        digest = hashlib.sha256(
            f"{key}|torch={torch.__version__}|ort={ort.__version__}|v{EXPORT_VERSION}".encode()).hexdigest()[:20]
        path = Path(cache_dir or tempfile.gettempdir()) / "onnx" / f"{digest}.onnx"
        t0 = time.perf_counter()
        restore = prepare() if prepare is not None else None
        try:
            if not path.exists():
                try:
                    with atomic_path(path, fsync=False) as tmp, torch.no_grad(), warnings.catch_warnings():
                        warnings.simplefilter("ignore")  # tracer notes on shapes the probes check below
                        torch.onnx.export(module, tuple(example), str(tmp), input_names=list(input_names),
                                          output_names=["out"], dynamic_axes=dynamic_axes, opset_version=17,
                                          dynamo=False)
                except Exception as e:
                    raise ModelError(f"ONNX export of {key} failed: {e}") from e
            out = cls(path, input_names, threads=threads)
            worst = 0.0
            with torch.no_grad():
                for args in probes:
                    ref = module(*args).float().numpy()
                    got = out(*(a.numpy() for a in args))
                    if ref.shape != got.shape:
                        raise ModelError(f"ONNX export of {key}: output shape {got.shape}, torch {ref.shape}")
                    worst = max(worst, float(np.abs(ref - got).max()))
        finally:
            if restore is not None:
                restore()
        if worst > atol:
            path.unlink(missing_ok=True)
            raise ModelError(f"ONNX export of {key} disagrees with torch (max |diff| {worst:.2e} > {atol:g})")
        log.info("onnxruntime query path for %s ready in %.1fs (max |diff| vs torch %.1e on %d probes)",
                 key, time.perf_counter() - t0, worst, len(probes))
        return out

    def quantized(self, *, key: str, exclude: Callable[[Any, set[str]], bool], probes: Sequence[Sequence[np.ndarray]],
                  min_cosine: float = 0.99, threads: int = 1) -> "OnnxModule":
        """This graph with dynamic int8 MatMuls (onnxruntime's ``quantize_dynamic``: int8 weights
        per output channel, activations quantised per call), cached beside it. ``exclude(node,
        initializer_names)`` keeps a MatMul node in float32. int8 is not exact, so the check is on what retrieval
        uses, the direction of each output row: every probe row's cosine to this graph's output
        must reach ``min_cosine``, else :class:`~vitrine.errors.ModelError` (the caller keeps
        float32)."""
        ort = _ort()
        try:
            import onnx
            from onnxruntime.quantization import QuantType, quantize_dynamic
        except ImportError as e:
            raise MissingExtra("int8 query graphs need onnx and onnxruntime's quantization tools: "
                               "pip install 'vitrine[fast]'") from e
        digest = hashlib.sha256(f"{self.path.name}|{key}|ort={ort.__version__}|v{EXPORT_VERSION}".encode()).hexdigest()[:20]
        path = self.path.parent / f"{digest}.int8.onnx"
        t0 = time.perf_counter()
        if not path.exists():
            try:
                graph = onnx.load(str(self.path))
                weights = {i.name for i in graph.graph.initializer}
                keep = [n.name for n in graph.graph.node if n.op_type == "MatMul" and exclude(n, weights)]
                with atomic_path(path, fsync=False) as tmp, warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    quantize_dynamic(str(self.path), str(tmp), weight_type=QuantType.QInt8, per_channel=True,
                                     op_types_to_quantize=["MatMul"], nodes_to_exclude=keep)
            except Exception as e:
                raise ModelError(f"int8 quantisation of {key} failed: {e}") from e
        out = OnnxModule(path, self.input_names, threads=threads)
        worst = 1.0
        for args in probes:
            ref, got = self(*args), out(*args)
            if ref.shape != got.shape:
                path.unlink(missing_ok=True)
                raise ModelError(f"int8 graph of {key}: output shape {got.shape}, float32 {ref.shape}")
            cos = (ref * got).sum(-1) / (np.linalg.norm(ref, axis=-1) * np.linalg.norm(got, axis=-1) + 1e-12)
            worst = min(worst, float(cos.min()))
        if worst < min_cosine:
            path.unlink(missing_ok=True)
            raise ModelError(f"int8 graph of {key} strays from float32 (cosine {worst:.4f} < {min_cosine})")
        log.info("int8 onnxruntime graph for %s ready in %.1fs (worst cosine vs float32 %.4f on %d probes)",
                 key, time.perf_counter() - t0, worst, len(probes))
        return out
