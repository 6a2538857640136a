"""Score anchors: canvases that need no painting skill.

* blank: the white starting canvas;
* mean-colour fill: the reference's mean RGB everywhere;
* dominant-colour fill: the centre of the largest of k=5 k-means colour
  clusters (scikit-learn, fixed seed, on at most 4096 sampled pixels).
"""
from __future__ import annotations

import numpy as np
from sklearn.cluster import KMeans

ANCHORS = ("blank", "mean-fill", "dominant-fill")


def blank(ref: np.ndarray) -> np.ndarray:
    return np.ones_like(ref, dtype=np.float32)


def mean_fill(ref: np.ndarray) -> np.ndarray:
    return np.broadcast_to(ref.reshape(-1, 3).mean(0), ref.shape).astype(np.float32).copy()


def dominant_color(ref: np.ndarray, k: int = 5, seed: int = 0) -> np.ndarray:
    px = ref.reshape(-1, 3).astype(np.float64)
    rng = np.random.default_rng(seed)
    if px.shape[0] > 4096:
        px = px[rng.choice(px.shape[0], 4096, replace=False)]
    k = min(k, len(np.unique(px, axis=0)))
    km = KMeans(n_clusters=k, n_init=3, random_state=seed).fit(px)
    counts = np.bincount(km.labels_, minlength=k)
    return km.cluster_centers_[int(np.argmax(counts))]


def dominant_fill(ref: np.ndarray) -> np.ndarray:
    return np.broadcast_to(dominant_color(ref), ref.shape).astype(np.float32).copy()


def anchor_canvas(name: str, ref: np.ndarray) -> np.ndarray:
    fns = {"blank": blank, "mean-fill": mean_fill, "dominant-fill": dominant_fill}
    if name not in fns:
        raise ValueError(f"unknown anchor {name!r}; choose from {ANCHORS}")
    return fns[name](np.asarray(ref, np.float32))
