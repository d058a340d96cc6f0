"""The Advisor tab's HTTP routes: thin wrappers over `service.AdvisorService`."""

from __future__ import annotations

import os
import threading
import time
from importlib import resources
from importlib.metadata import entry_points

from tensorboard.backend import http_util
from tensorboard.plugins import base_plugin
from werkzeug import wrappers

from tb_gpuadvisor import metadata, service

# Frontend files are served from an allow-list built from the package folder,
# one exact route each, so no request path ever reaches the file system.
_STATIC_TYPES = {".js": "text/javascript", ".css": "text/css"}
# A negative is_active() answer is re-checked at most this often.
_PROBE_INTERVAL_S = 5.0


def _frontend_files() -> dict[str, bytes]:
    """{file name: contents} of the shipped ES modules and stylesheets."""
    folder = resources.files("tb_gpuadvisor.frontend")
    files = {}
    for entry in folder.iterdir():
        if entry.is_file() and os.path.splitext(entry.name)[1] in _STATIC_TYPES:
            files[entry.name] = entry.read_bytes()
    return files


class GpuAdvisorPlugin(base_plugin.TBPlugin):
    """Ranked GPU performance findings for the profile captures under the logdir."""

    plugin_name = metadata.PLUGIN_NAME

    def __init__(self, context: base_plugin.TBContext) -> None:
        flags = context.flags
        logdir_spec = getattr(flags, "logdir_spec", "") if flags is not None else ""
        self._service = service.AdvisorService(
            service.roots_from_flags(context.logdir, logdir_spec)
        )
        self._static = _frontend_files()
        self._active = False
        self._probe_lock = threading.Lock()
        self._probing = False
        self._last_probe = float("-inf")
        self._start_probe()

    # -- TBPlugin ------------------------------------------------------------------

    def get_plugin_apps(self) -> dict:
        apps = {
            "/runs": self._serve_runs,
            "/report": self._serve_report,
            "/compare": self._serve_compare,
            "/info": self._serve_info,
            "/timeline": self._serve_timeline,
        }
        for name in self._static:
            apps["/" + name] = self._serve_static
        return apps

    def is_active(self) -> bool:
        """Never parses a capture: a background walk looks for capture files.

        A positive answer is final; a negative one starts another walk (at most
        every few seconds) so captures written later make the tab active.
        """
        if not self._active:
            self._start_probe()
        return self._active

    def frontend_metadata(self) -> base_plugin.FrontendMetadata:
        # The frontend refreshes itself (polling while analyses run), so
        # TensorBoard's reload timer would only re-fetch unchanged data.
        return base_plugin.FrontendMetadata(
            es_module_path="/index.js",
            tab_name=metadata.TAB_NAME,
            disable_reload=True,
        )

    def data_plugin_names(self) -> tuple:
        # Captures are plain files, not summaries: no data provider plugin to ask.
        return ()

    # -- activity probe ----------------------------------------------------------------

    def _start_probe(self) -> None:
        with self._probe_lock:
            now = time.monotonic()
            if self._probing or now - self._last_probe < _PROBE_INTERVAL_S:
                return
            self._probing = True
            self._last_probe = now
        threading.Thread(target=self._probe, name="gpu_advisor_probe", daemon=True).start()

    def _probe(self) -> None:
        try:
            if self._service.has_sessions():
                self._active = True
        finally:
            with self._probe_lock:
                self._probing = False

    # -- routes ------------------------------------------------------------------------

    @wrappers.Request.application
    def _serve_info(self, request: wrappers.Request) -> wrappers.Response:
        """Whether the Profile tab the evidence links open is installed, and what installs it."""
        installed = any(e.name == metadata.PROFILE_PLUGIN for e in entry_points(group="tensorboard_plugins"))
        return http_util.Respond(request, {"profile_tab": installed, "profile_install": metadata.PROFILE_INSTALL},
                                 "application/json")

    @wrappers.Request.application
    def _serve_runs(self, request: wrappers.Request) -> wrappers.Response:
        return self._answer(request, self._service.runs)

    @wrappers.Request.application
    def _serve_report(self, request: wrappers.Request) -> wrappers.Response:
        args = request.args
        return self._answer(
            request,
            lambda: self._service.report(args.get("run"), args.get("session"), args.get("host")),
        )

    @wrappers.Request.application
    def _serve_compare(self, request: wrappers.Request) -> wrappers.Response:
        args = request.args
        return self._answer(
            request,
            lambda: self._service.compare(
                args.get("run"),
                args.get("session"),
                args.get("base_run"),
                args.get("base_session"),
            ),
        )

    @wrappers.Request.application
    def _serve_timeline(self, request: wrappers.Request) -> wrappers.Response:
        args = request.args
        return self._answer(
            request, lambda: self._service.timeline(args.get("run"), args.get("session"), args.get("step")))

    @wrappers.Request.application
    def _serve_static(self, request: wrappers.Request) -> wrappers.Response:
        # Routed for names in self._static, but TensorBoard also routes "<name>/..." here.
        name = request.path.rsplit("/", 1)[-1]
        if name not in self._static:
            return http_util.Respond(request, {"error": "not found"}, "application/json", code=404)
        return http_util.Respond(request, self._static[name], _STATIC_TYPES[os.path.splitext(name)[1]])

    def _answer(self, request: wrappers.Request, compute) -> wrappers.Response:
        """JSON for a report-like result: 200 done, 202 pending (analysing, or a trace the profiler is
        still writing), 400/404 on bad names, 422 when a session to compare could not be analysed,
        503 when the queue is full or a remote logdir cannot be searched."""
        try:
            result = compute()
        except service.BadRequest as exc:
            return http_util.Respond(request, {"error": str(exc)}, "application/json", code=400)
        except service.NotFound as exc:
            return http_util.Respond(request, {"error": str(exc)}, "application/json", code=404)
        except service.NotComparable as exc:
            return http_util.Respond(request, {"error": str(exc), "unreadable": exc.side}, "application/json",
                                     code=422)
        except (service.Busy, service.Unavailable) as exc:
            return http_util.Respond(request, {"error": str(exc)}, "application/json", code=503)
        if isinstance(result, service.Pending):
            body = {"status": "pending", "progress": result.progress}
            return http_util.Respond(request, body, "application/json", code=202)
        return http_util.Respond(request, result, "application/json")
