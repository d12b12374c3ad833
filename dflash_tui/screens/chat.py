"""The main screen: transcript, prompt, live sidebar; drives one reply at a time."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Footer, Header, Label, ProgressBar, Static

from dflash_tui.host import ChatHost, host_of
from dflash_tui.messages import (
    EngineFailed,
    EngineProgress,
    EngineReady,
    ReplyFinished,
    SpanBatch,
    ToggleView,
)
from dflash_tui.widgets.prompt import PromptInput
from dflash_tui.widgets.sidebar import SpeedLine, StatsSidebar
from dflash_tui.widgets.transcript import MessageView, Transcript
from dflash_tui.worker import GenerateJob

if TYPE_CHECKING:
    from dflash_tui.config import ChatSettings

FLUSH_INTERVAL = 0.5  # seconds between DB writes of a streaming reply (kill -9 loses < 1 s)
COMPACT_WIDTH = 90  # below this many columns the sidebar folds into the speed line


class ChatScreen(Screen):
    # priority: the prompt's TextArea has its own ctrl+y (redo) and would swallow them.
    BINDINGS = [
        Binding("escape", "stop", "Stop reply", id="chat.stop", priority=True),
        Binding("ctrl+y", "copy_last", "Copy reply", id="chat.copy_last", priority=True),
        Binding(
            "ctrl+t", "toggle_colours", "Draft colours", id="chat.toggle_colours", priority=True
        ),
        Binding("ctrl+b", "toggle_sidebar", "Sidebar", id="chat.toggle_sidebar", priority=True),
        Binding(  # out of the footer: F1 and F2 must fit in 80 columns
            "ctrl+o", "toggle_compact", "Compact", id="chat.toggle_compact", priority=True,
            show=False,
        ),
        Binding(
            "ctrl+r", "regenerate", "Regenerate reply", id="chat.regenerate", priority=True,
            show=False,
        ),
        Binding(
            "ctrl+g", "edit_last", "Edit last message", id="chat.edit_last", priority=True,
            show=False,
        ),
    ]

    DEFAULT_CSS = """
    ChatScreen #main { width: 1fr; }
    ChatScreen #loading { height: auto; padding: 0 1; display: none; }
    ChatScreen #loading.visible { display: block; }
    ChatScreen #loading ProgressBar { width: 1fr; }
    ChatScreen.compact StatsSidebar, ChatScreen.no-sidebar StatsSidebar { display: none; }
    ChatScreen.compact SpeedLine, ChatScreen.no-sidebar SpeedLine { display: block; }
    ChatScreen PromptInput { margin: 0 1; }
    """

    def __init__(self) -> None:
        super().__init__()
        self.request_id = 0
        self.active: GenerateJob | None = None
        self.reply_view: MessageView | None = None
        self.reply_db_id: int | None = None
        self._last_flush = 0.0
        self._auto_compact = False
        self.editing: list[int] = []  # message ids the prompt's text will replace when sent

    @property
    def host(self) -> ChatHost:
        """The app's state: this screen draws it and asks the app to change it."""
        return host_of(self)

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal():
            with Vertical(id="main"):
                yield Transcript(id="transcript")
                with Vertical(id="loading"):
                    yield Label("", id="loading-text", markup=False)
                    yield ProgressBar(total=1.0, show_eta=False, id="loading-bar")
                yield SpeedLine(id="speed")
                yield PromptInput(id="prompt")
            yield StatsSidebar(id="sidebar")
        yield Footer()

    async def on_mount(self) -> None:
        self.apply_view()
        self.query_one(SpeedLine).show_stats(None)
        self.query_one(PromptInput).focus()
        await self.host.open_conversation(self.host.start_conversation)

    def apply_view(self) -> None:
        """Show the app's view settings (sidebar, compact, draft colours)."""
        s = self.host.settings
        self.set_class(not s.show_sidebar, "no-sidebar")
        self.set_class(s.compact or self._auto_compact, "compact")
        for view in self.query(MessageView):
            view.set_colours(s.draft_colours)
        self.query_one(StatsSidebar).set_legend(s.draft_colours)

    def on_resize(self) -> None:
        narrow = self.size.width < COMPACT_WIDTH
        if narrow != self._auto_compact:
            self._auto_compact = narrow
            self.set_class(narrow or self.host.settings.compact, "compact")

    # conversation loading -------------------------------------------------------------------

    async def show_conversation(self, conversation_id: int | None) -> None:
        """Replace the transcript with a stored conversation (None: an empty new chat).
        The app decides which conversation is open; this only draws it."""
        await self.stop_reply()
        transcript = self.query_one(Transcript)
        await transcript.remove_children()
        store = self.host.store
        views = []
        if conversation_id is not None:
            for m in store.messages(conversation_id):
                view = MessageView(m.role, m.content, m.status)
                view.message_id = m.id
                if m.stats:
                    view.footer_text = _footer(m.stats)
                views.append(view)
        if views:
            await transcript.mount_all(views)
            for view in views:
                view.set_footer(view.footer_text)
                view.set_colours(self.host.settings.draft_colours)
        else:
            await transcript.mount(
                Static(
                    "Type a message and press Enter. F2 picks a model pair, Ctrl+L lists "
                    "conversations, F1 shows every key.",
                    id="empty",
                )
            )
        transcript.anchor()
        self.query_one(StatsSidebar).reset()
        self.query_one(SpeedLine).show_stats(None)
        self.show_settings(self.host.effective())

    def show_settings(self, chat: ChatSettings) -> None:
        """Show the settings the next reply uses (the app calls this when they change)."""
        self.query_one(StatsSidebar).set_sampling(chat)
        self.query_one(SpeedLine).set_temperature(chat.temperature)

    # sending --------------------------------------------------------------------------------

    @on(PromptInput.Submitted)
    async def on_prompt_submitted(self, event: PromptInput.Submitted) -> None:
        if self.active is not None:
            self.notify("A reply is still streaming: press Esc to stop it first.", timeout=3)
            return
        event.prompt.clear()
        if self.editing:
            # Replaced only now, when the edited text is sent: a cancelled edit loses nothing.
            await self._drop_messages(self.editing)
            self.editing = []
        await self.send(event.text)

    async def send(self, text: str) -> None:
        host = self.host
        cid = host.begin_conversation(text)
        # The user turn is committed before the engine sees it: a crash cannot lose it.
        user_row = host.add_turn("user", text)
        transcript = self.query_one(Transcript)
        user_view = MessageView("user", text)
        user_view.message_id = user_row.id
        await transcript.add(user_view)
        await self._reply(cid)

    async def _reply(self, cid: int) -> None:
        """Stream a new assistant turn for the conversation as stored."""
        host = self.host
        chat = host.effective()
        transcript = self.query_one(Transcript)
        prompt = self._prompt_for(cid, chat.system_prompt)
        reply_row = host.add_turn("assistant", "", status="streaming")
        view = MessageView("assistant", "", "streaming")
        view.message_id = reply_row.id
        await transcript.add(view)
        view.set_colours(host.settings.draft_colours)
        transcript.anchor()

        self.request_id += 1
        self.reply_view, self.reply_db_id = view, reply_row.id
        self._last_flush = time.monotonic()
        self.query_one(StatsSidebar).reset()
        self.active = host.worker.submit_generate(
            GenerateJob(self.request_id, prompt, chat.max_tokens, chat.block_size, chat.sampling)
        )
        self.refresh_bindings()  # Esc (stop) appears in the footer only while streaming

    def _prompt_for(self, conversation_id: int, system_prompt: str | None) -> list[dict[str, str]]:
        prompt = []
        if system_prompt:
            prompt.append({"role": "system", "content": system_prompt})
        for m in self.host.store.messages(conversation_id):
            if m.role in ("user", "assistant") and m.content.strip():
                prompt.append({"role": m.role, "content": m.content})
        return prompt

    # engine events --------------------------------------------------------------------------

    async def on_span_batch(self, batch: SpanBatch) -> None:
        if self.active is None or batch.request_id != self.active.request_id:
            return  # a batch that raced with Esc: the reply is already final
        assert self.reply_view is not None
        await self.reply_view.append(batch.text, batch.segments)
        sidebar = self.query_one(StatsSidebar)
        was_collapsed = sidebar.collapsed is not None
        sidebar.update_stats(batch.stats, batch.cycle_tokens)
        if sidebar.collapsed is not None and not was_collapsed:
            # Also when the sidebar is hidden: a silent collapse is what users complain about.
            self.notify(
                str(sidebar.query_one("#hint").render()), severity="warning", timeout=8,
                markup=False,
            )
        self.query_one(SpeedLine).show_stats(batch.stats)
        now = time.monotonic()
        if now - self._last_flush >= FLUSH_INTERVAL and self.reply_db_id is not None:
            self.host.save_turn(self.reply_db_id, self.reply_view.content)
            self._last_flush = now

    async def on_reply_finished(self, event: ReplyFinished) -> None:
        if self.active is None or event.request_id != self.active.request_id:
            return
        status = "length" if event.finish_reason == "length" else "done"
        if event.finish_reason == "cancelled":
            status = "stopped"
        footer = _footer(event.summary) if event.summary else ""
        if event.summary:
            speculative = event.summary.get("speculative", True)
            self.query_one(StatsSidebar).set_fallback(
                None if speculative else event.summary.get("fallback_reason") or "target alone"
            )
        await self._finish_reply(status, footer, event.summary)

    async def on_engine_failed(self, event: EngineFailed) -> None:
        if event.during == "generate":
            if self.active is not None and event.request_id == self.active.request_id:
                await self._finish_reply("error", event.error, {})
            self._show_error(event.error)
        else:
            self._hide_loading()
            self.query_one(StatsSidebar).set_info(None, "not loaded (see error)")
            self._show_error(event.error)

    def on_engine_progress(self, event: EngineProgress) -> None:
        box = self.query_one("#loading")
        box.add_class("visible")
        self.query_one("#loading-text", Label).update(event.text)
        bar = self.query_one("#loading-bar", ProgressBar)
        if event.fraction is None:
            bar.update(total=None)
        else:
            bar.update(total=1.0, progress=event.fraction)

    def on_engine_ready(self, event: EngineReady) -> None:
        self._hide_loading()
        self.query_one(StatsSidebar).set_info(event.info)
        self.notify(
            f"Loaded {event.info.get('target')} + {event.info.get('draft')}", timeout=3,
            markup=False,
        )

    def _hide_loading(self) -> None:
        self.query_one("#loading").remove_class("visible")

    def _show_error(self, error: str) -> None:
        # Engine and pip messages are text: their square brackets are not markup.
        self.notify(error, title="Problem", severity="error", timeout=10, markup=False)
        notice = Static(error, classes="notice", markup=False)
        transcript = self.query_one(Transcript)
        self.call_later(transcript.add, notice)

    async def _finish_reply(self, status: str, footer: str, summary: dict[str, Any]) -> None:
        view, db_id = self.reply_view, self.reply_db_id
        self.active, self.reply_view, self.reply_db_id = None, None, None
        self.refresh_bindings()
        if view is None:
            return
        await view.finish(status, footer if status != "error" else f"✗ {footer}")
        if db_id is not None:
            self.host.save_turn(db_id, view.content, status=status, stats=summary)

    async def stop_reply(self) -> None:
        """Stop a streaming reply (if any), keeping its text: before another chat opens."""
        if self.active is not None:
            self.host.worker.cancel(self.active.request_id)
            await self._finish_reply("stopped", "stopped", {})

    # actions --------------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "stop":
            # Only claim Esc while a reply streams (or an edit is open), so modals and the
            # input keep their own Esc.
            return self.active is not None or bool(self.editing)
        return True

    async def _drop_messages(self, ids: list[int]) -> None:
        self.host.drop_turns(ids)
        for view in self.query_one(Transcript).messages():
            if view.message_id in ids:
                await view.remove()

    async def action_regenerate(self) -> None:
        """Replace the last reply with a new one (the conversation before it is unchanged)."""
        cid = self.host.conversation_id
        if self.active is not None or cid is None:
            self.notify("Nothing to regenerate yet." if cid is None else
                        "A reply is still streaming: press Esc to stop it first.", timeout=3)
            return
        messages = self.host.store.messages(cid)
        if not messages or messages[-1].role != "assistant":
            self.notify("The last message is not a reply: send a message instead.", timeout=3)
            return
        await self._drop_messages([messages[-1].id])
        await self._reply(cid)

    def action_edit_last(self) -> None:
        """Put the last message you sent back in the prompt; Enter resends it in place of the
        old one and its reply, Esc keeps things as they were."""
        cid = self.host.conversation_id
        if self.active is not None:
            self.notify("A reply is still streaming: press Esc to stop it first.", timeout=3)
            return
        messages = self.host.store.messages(cid) if cid is not None else []
        users = [m for m in messages if m.role == "user"]
        if not users:
            self.notify("No message of yours to edit yet.", timeout=3)
            return
        last = users[-1]
        self.editing = [m.id for m in messages if m.id >= last.id]
        prompt = self.query_one(PromptInput)
        prompt.clear()
        prompt.insert(last.content)
        prompt.focus()
        self.refresh_bindings()
        self.notify("Editing your last message: Enter resends it (replacing it and its reply), "
                    "Esc cancels.", timeout=5)

    async def action_stop(self) -> None:
        """Stop at once: the UI finalises now; late batches from the engine are ignored."""
        if self.active is None:
            if self.editing:  # Esc cancels an edit and leaves the conversation as it was
                self.editing = []
                self.query_one(PromptInput).clear()
                self.refresh_bindings()
            return
        self.host.worker.cancel(self.active.request_id)
        await self._finish_reply("stopped", "stopped by you (Esc)", {})

    def action_copy_last(self) -> None:
        replies = [v for v in self.query_one(Transcript).messages() if v.role == "assistant"]
        if not replies:
            self.notify("Nothing to copy yet.", timeout=2)
            return
        replies[-1].action_copy()

    def action_toggle_colours(self) -> None:
        self.post_message(ToggleView("draft_colours"))

    def action_toggle_sidebar(self) -> None:
        self.post_message(ToggleView("show_sidebar"))

    def action_toggle_compact(self) -> None:
        self.post_message(ToggleView("compact"))


def _footer(summary: dict[str, Any]) -> str:
    if not summary:
        return ""
    parts = [f"{summary.get('tokens', 0)} tokens", f"{summary.get('tok_s', 0):.1f} tok/s"]
    if summary.get("speculative", True):
        parts += [
            f"acceptance {summary.get('acceptance', 0):.0%}",
            f"{summary.get('tokens_per_cycle', 0):.2f} tokens/cycle",
        ]
    elif summary.get("fallback_reason"):
        parts.append(f"target only: {summary['fallback_reason']}")
    return " · ".join(parts)
