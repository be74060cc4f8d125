"""A self-hosted teacher (SGLang, or any OpenAI-compatible server, from a command template):
reached through the server its allocation shares (``service``: the service file of a rule
serve_teacher job, runtime/service.py), or, given none, started inside the job, always stopped.
Either way it generates through the ``openai`` backend.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..config import SGLangSpec
from ..provenance.sidecars import Notes
from ..runtime.service import Server, ServerError, await_ready, identity, note_weights
from .base import TeacherError
from .openai import OpenAITeacher


class SGLangTeacher(OpenAITeacher):
    Spec = SGLangSpec

    def __init__(
        self,
        name: str,
        spec: Mapping[str, Any],
        notes: Notes | None = None,
        service: str | None = None,
    ):
        super().__init__(name, spec, notes)
        self.service = service
        self.server: Server | None = None
        self.served_by: dict[str, Any] | None = None  # the shared server used (service.identity)

    async def astart(self) -> None:
        server = self.spec["server"]
        role = f"teacher:{self.name}"
        try:
            if self.service:
                ready = await await_ready(self.service, server["startup_timeout_s"] + 60)
                self.spec["base_url"], info = ready["base_url"], ready.get("model_info")
                self.served_by = identity(ready)
            else:
                self.server = Server(f"teacher '{self.name}'", server)
                info = await self.server.astart()
                self.spec["base_url"] = self.server.base_url
        except ServerError as exc:
            raise TeacherError(str(exc), 1) from None
        note_weights(self.notes, role, info)

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()

    async def aclose(self) -> None:
        await super().aclose()
        self.stop()
