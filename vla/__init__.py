"""vla: a small decoder-only action-transformer toolkit for robot policies.

A trained policy drives a robot with `load_policy(DIR)`, then `policy.reset(instruction)` once per
episode and `policy.act(obs)` every control step (see README, "Evaluate, deploy, look inside").
`load_policy` is vla/policy/load.py's, imported on first use so that `import vla` stays light.
"""

__version__ = "0.1.0"


def __getattr__(name: str):
    if name == "load_policy":
        from vla.policy.load import load_policy

        return load_policy
    raise AttributeError(f"module 'vla' has no attribute {name!r}")


__all__ = ["load_policy", "__version__"]
