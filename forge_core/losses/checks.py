"""Hyperparameter checks of the built-in losses, as pure functions: each loss's constructor calls them, and the
controller calls `check_loss` to refuse a bad config without building the loss (only the trainer builds it)."""

from __future__ import annotations

import inspect

AGGREGATIONS = ("seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm")
KL_ESTIMATORS = ("k1", "k2", "k3")


def check_values(**params) -> None:
    """Refuse bad values among the given hyperparameters (those not given are not checked)."""
    aggregation = params.get("aggregation")
    if aggregation is not None and aggregation not in AGGREGATIONS:
        raise ValueError(f"unknown loss.aggregation {aggregation!r}; choose one of {AGGREGATIONS}")
    if aggregation == "seq-mean-token-sum-norm" and (params.get("max_len") is None or params["max_len"] <= 0):
        raise ValueError("aggregation 'seq-mean-token-sum-norm' needs a positive loss.max_len "
                         "(usually generator.max_new_tokens)")
    if "kl_estimator" in params and params["kl_estimator"] not in KL_ESTIMATORS:
        raise ValueError(f"unknown loss.kl_estimator {params['kl_estimator']!r}; choose one of {KL_ESTIMATORS}")
    clips = [params.get(k) for k in ("clip_low", "clip_high") if params.get(k) is not None]
    if any(c < 0 for c in clips):
        raise ValueError(f"loss.clip_low/clip_high must be >= 0; got {params.get('clip_low')}, "
                         f"{params.get('clip_high')}")
    if params.get("clip_ratio_c") is not None and params["clip_ratio_c"] <= 1.0:
        raise ValueError(f"loss.clip_ratio_c must be > 1 (dual clip, e.g. 3.0); got {params['clip_ratio_c']}")
    if params.get("clip_ratio") is not None and params["clip_ratio"] <= 0:
        raise ValueError(f"loss.clip_ratio must be > 0 (e.g. 2.0) or null; got {params['clip_ratio']}")
    taus = [params.get(k) for k in ("tau_pos", "tau_neg") if params.get(k) is not None]
    if any(t <= 0 for t in taus):
        raise ValueError(f"loss.tau_pos/tau_neg must be > 0; got {params.get('tau_pos')}, {params.get('tau_neg')}")


def constructor_signature(factory) -> tuple[set[str] | None, dict]:
    """(the keyword arguments a loss accepts, their defaults), following `**kwargs` up to the parent constructor
    (the subclass's defaults win); names are None when it takes any keyword (a `**kwargs` with no parent to follow)."""
    names: set[str] = set()
    defaults: dict = {}
    for cls in (inspect.getmro(factory) if inspect.isclass(factory) else (factory,)):
        if inspect.isclass(cls) and "__init__" not in vars(cls):
            continue
        params = inspect.signature(cls.__init__ if inspect.isclass(cls) else cls).parameters.values()
        named = [p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self"]
        names |= {p.name for p in named}
        for p in named:
            if p.default is not p.empty:
                defaults.setdefault(p.name, p.default)
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            return names, defaults
        if not inspect.isclass(cls) or cls.__mro__[1] is object:
            return None, defaults
    return None, defaults


def check_hyperparameters(name: str, factory, hyperparams: dict) -> None:
    """Unknown hyperparameter names and bad values of loss `name` (with its defaults), found without building it."""
    names, defaults = constructor_signature(factory)
    unknown = sorted(set(hyperparams) - names) if names is not None else []
    if unknown:
        raise ValueError(f"loss {name!r} rejected hyperparameters {unknown}: it accepts {sorted(names)}")
    check_values(**{**defaults, **hyperparams})
