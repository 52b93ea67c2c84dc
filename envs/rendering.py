"""Offscreen rendering on a CPU: EGL first (Mesa software), OSMesa as the fallback, one clear error.

We drive MuJoCo's low-level renderer (`MjrContext`, `mjv_updateScene`, `mjr_readPixels`) directly
instead of `mujoco.Renderer`: it lets us pick and fall back between GL backends at run time and
renders into a preallocated buffer, which matters when a frame costs well under a millisecond.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import weakref

import mujoco
import numpy as np


class RenderingUnavailable(RuntimeError):
    """No offscreen GL backend could be started."""


_BACKEND: str | None = None  # the backend that worked in this process, once one has
_LIVE: weakref.WeakSet = weakref.WeakSet()  # renderers to free before the GL libraries unload


def _close_all() -> None:
    for renderer in list(_LIVE):
        renderer.close()


def _forget_opengl() -> None:
    # PyOpenGL binds its platform (EGL or OSMesa) at import; drop it so another backend can load.
    for name in list(sys.modules):
        if name == "OpenGL" or name.startswith("OpenGL.") or name in ("mujoco.egl", "mujoco.osmesa"):
            del sys.modules[name]


def _new_context(backend: str, width: int, height: int):
    os.environ["MUJOCO_GL"] = backend
    os.environ["PYOPENGL_PLATFORM"] = backend
    if backend == "egl":
        from mujoco.egl import GLContext
    elif backend == "osmesa":
        from mujoco.osmesa import GLContext
    elif backend == "glfw":
        from mujoco.glfw import GLContext
    else:
        raise RenderingUnavailable(f"MUJOCO_GL={backend!r} is not supported here; use egl or osmesa")
    ctx = GLContext(width, height)
    ctx.make_current()
    if _BACKEND is None:  # first use in this process: prove the context can really render
        probe = mujoco.MjModel.from_xml_string("<mujoco/>")
        mujoco.MjrContext(probe, mujoco.mjtFontScale.mjFONTSCALE_100).free()
    return ctx


def gl_context(width: int, height: int):
    """A current offscreen GL context: the backend in MUJOCO_GL if set, else EGL then OSMesa."""
    global _BACKEND
    if _BACKEND is not None:
        return _new_context(_BACKEND, width, height)
    chosen = os.environ.get("MUJOCO_GL", "").strip().lower()
    candidates = [chosen] if chosen else ["egl", "osmesa"]
    errors = []
    for backend in candidates:
        try:
            ctx = _new_context(backend, width, height)
        except Exception as e:  # noqa: BLE001 - any failure means "try the next backend"
            errors.append(f"{backend}: {type(e).__name__}: {str(e).strip() or 'failed'}".splitlines()[0])
            _forget_opengl()
            continue
        _BACKEND = backend
        # Registered after the backend's own exit hook (EGL registers eglTerminate on first use), so
        # ours runs first: contexts are freed while the display still exists.
        atexit.register(_close_all)
        return ctx
    raise RenderingUnavailable(
        "offscreen rendering is unavailable (" + "; ".join(errors) + "). Install EGL or OSMesa "
        "(Debian: apt-get install libegl1 libgl1-mesa-dri libosmesa6) or set MUJOCO_GL to a working backend."
    )


class CameraRenderer:
    """Renders one fixed camera of a model into a reused uint8 (H, W, 3) buffer."""

    def __init__(self, model: mujoco.MjModel, camera: str, height: int, width: int):
        self._model = model
        self._ctx = gl_context(width, height)
        self._mjr = mujoco.MjrContext(model, mujoco.mjtFontScale.mjFONTSCALE_100)
        mujoco.mjr_setBuffer(mujoco.mjtFramebuffer.mjFB_OFFSCREEN, self._mjr)
        self._scene = mujoco.MjvScene(model, maxgeom=200)
        self._option = mujoco.MjvOption()
        self._camera = mujoco.MjvCamera()
        self._camera.type = mujoco.mjtCamera.mjCAMERA_FIXED
        self._camera.fixedcamid = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_CAMERA, camera)
        if self._camera.fixedcamid < 0:
            raise ValueError(f"the model has no camera named {camera!r}")
        self._rect = mujoco.MjrRect(0, 0, width, height)
        self._buffer = np.empty((height, width, 3), dtype=np.uint8)
        _LIVE.add(self)

    def render(self, data: mujoco.MjData) -> np.ndarray:
        """The camera's current view as a new uint8 (H, W, 3) array, top row first."""
        self._ctx.make_current()
        mujoco.mjv_updateScene(
            self._model, data, self._option, None, self._camera, mujoco.mjtCatBit.mjCAT_ALL, self._scene
        )
        mujoco.mjr_render(self._rect, self._scene, self._mjr)
        mujoco.mjr_readPixels(self._buffer, None, self._rect, self._mjr)
        return self._buffer[::-1].copy()  # GL's origin is bottom-left

    def close(self) -> None:
        if self._ctx is not None:
            self._ctx.make_current()
            self._mjr.free()
            self._ctx.free()
            self._ctx = None

    def __del__(self):
        with contextlib.suppress(Exception):  # at interpreter shutdown GL may be gone already
            self.close()
