import os

# Offscreen rendering for every test; EGL (Mesa software) unless the caller chose otherwise.
os.environ.setdefault("MUJOCO_GL", "egl")
