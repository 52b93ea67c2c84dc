"""vla: a small decoder-only action-transformer toolkit for robot policies.

A trained policy drives a robot with `load_policy(DIR)`, then `policy.reset(instruction)` once per
episode and `policy.act(obs)` every control step (see README, "Evaluate, deploy, look inside").
"""

__version__ = "0.1.0"


def load_policy(checkpoint_dir, device=None, kv_cache=None, backend="torch", **overrides):
    """Load a trained policy from a checkpoint directory (safetensors + JSON; never unpickles).

    `kv_cache` and `overrides` replace PolicyConfig fields saved with the checkpoint (readout,
    temporal_ensemble, ensemble_coeff, n_action_steps, temperature). backend="onnxruntime" runs the
    graphs `vla-export` wrote (DIR/export/, or DIR itself) without importing torch."""
    if backend == "onnxruntime":
        from vla.policy.onnx_policy import load_onnx_policy

        if kv_cache is not None:
            overrides["kv_cache"] = kv_cache
        return load_onnx_policy(checkpoint_dir, **overrides)
    from vla.policy.torch_policy import load_policy as _load

    return _load(checkpoint_dir, device=device, kv_cache=kv_cache, backend=backend, **overrides)


__all__ = ["load_policy", "__version__"]
