"""mmloader doing the same work: one Loader, C worker threads, the same tokenizer file,
the Qwen2.5-VL preset with the same pixel limits, no shuffling (record order)."""

from __future__ import annotations

from typing import Any, Dict, Iterator, Optional

from .common import Config


def available(cfg: Optional[Config] = None) -> Optional[str]:
    try:
        import mmloader
    except ImportError as e:
        return f"mmloader does not import ({e})"
    if not hasattr(mmloader, "Loader"):
        return "mmloader.Loader is not built in this checkout"
    import inspect

    known = inspect.signature(mmloader.Loader.__init__).parameters
    missing = [k for k in (cfg or {}).get("mmloader_kwargs") or {} if k not in known]
    if missing:
        return f"this mmloader has no Loader option {', '.join(missing)}"
    return None


def preload(cfg: Config) -> None:
    import mmloader  # noqa: F401


def loader_kwargs(cfg: Config) -> Dict[str, Any]:
    kw: Dict[str, Any] = dict(
        tokenizer=cfg["tokenizer"],
        preset="qwen2.5-vl",
        micro_batch_size=cfg["batch_size"],
        num_threads=cfg["threads"],
        prefetch=cfg["prefetch"],
        shuffle=False,
        min_pixels=cfg["min_pixels"],
        max_pixels=cfg["max_pixels"],
        max_inflight=cfg["inflight"],
    )
    kw.update(cfg.get("mmloader_kwargs") or {})
    return kw


class Pipeline:
    def __init__(self, cfg: Config):
        import mmloader

        if cfg.get("limit"):
            raise ValueError("mmloader reads whole shards: pass a subset shard instead of limit")
        self.cfg = cfg
        self.loader = mmloader.Loader(list(cfg["shards"]), **loader_kwargs(cfg))

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        return iter(self.loader)

    def close(self) -> None:
        self.loader.close()


def extra_stats(pipe: Pipeline) -> Dict[str, Any]:
    st = pipe.loader.stats()
    return {
        "loader_wait_ratio": st.get("wait_time_ratio"),
        # the engine's own threads, after its pool has filled (None on a short run)
        "engine_faults_per_batch": st.get("page_faults_per_batch"),
        "loader_stats": st,
    }


__all__ = ["available", "build", "preload"]


def build(cfg: Config) -> Pipeline:
    return Pipeline(cfg)
