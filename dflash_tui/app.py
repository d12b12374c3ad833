"""The dflash-chat application: wires the store, settings, engine worker and screens."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from pathlib import Path

from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.screen import Screen

from dflash_tui import config
from dflash_tui.backends import Backend, RealBackend
from dflash_tui.screens.chat import ChatScreen
from dflash_tui.screens.conversations import NEW, ConversationsScreen
from dflash_tui.screens.help import HelpScreen
from dflash_tui.screens.modals import SettingsScreen
from dflash_tui.screens.picker import PickerScreen
from dflash_tui.store import Store, export_markdown
from dflash_tui.worker import EngineWorker


class DFlashChatApp(App[None]):
    TITLE = "dflash-chat"
    SUB_TITLE = "New chat"
    ENABLE_COMMAND_PALETTE = True
    BINDINGS = [
        Binding("ctrl+q", "quit", "Quit", id="app.quit", priority=True),
        Binding("f1", "help", "Help", id="app.help"),
        Binding("f2", "pick_model", "Models", id="app.pick_model"),
        Binding("ctrl+l", "conversations", "Chats", id="app.conversations"),
        Binding("ctrl+n", "new_conversation", "New", id="app.new_conversation"),
        Binding("f5", "settings", "Settings", id="app.settings"),
        Binding("ctrl+e", "export", "Export", id="app.export"),
    ]

    def __init__(
        self,
        model: str | None = None,
        draft: str | None = None,
        backend_factory: Callable[[], Backend] = RealBackend,
        data_dir: Path | None = None,
        config_file: Path | None = None,
        conversation_id: int | None = None,
    ) -> None:
        super().__init__()
        self.config_file = config_file or config.config_path()
        self.settings, self.config_problem = config.load_settings(self.config_file)
        self.model = model or self.settings.model or None
        self.draft = draft or self.settings.draft or None
        self.data_dir = data_dir or config.data_dir()
        self.store = Store.open_default(self.data_dir)
        self.conversation_id: int | None = None
        self.start_conversation = conversation_id
        self.chat = ChatScreen()
        self.worker = EngineWorker(backend_factory, self.chat.post_message)

    def get_default_screen(self) -> Screen:
        return self.chat

    async def on_mount(self) -> None:
        if self.settings.theme in self.available_themes:
            self.theme = self.settings.theme
        self.worker.start()
        self.load_pair(self.model, self.draft)
        if self.config_problem:
            self.notify(self.config_problem, severity="warning", timeout=10)

    def watch_theme(self, theme: str) -> None:
        if theme != self.settings.theme:
            self.settings.theme = theme
            self.save_settings()

    def save_settings(self) -> None:
        try:
            config.save_settings(self.settings, self.config_file)
        except OSError as exc:
            self.notify(f"Could not save settings to {self.config_file}: {exc}", severity="error")

    def load_pair(self, model: str | None, draft: str | None) -> None:
        self.model, self.draft = model, draft
        conv = self.store.get_conversation(self.conversation_id) if self.conversation_id else None
        block = (
            conv.block_size if conv and conv.block_size is not None else self.settings.block_size
        )
        self.worker.submit_load(model, draft, block)

    async def open_conversation(self, conversation_id: int | None) -> None:
        await self.chat.show_conversation(conversation_id)

    async def on_unmount(self) -> None:
        self.worker.shutdown()
        self.store.close()

    # actions --------------------------------------------------------------------------------

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    def action_pick_model(self) -> None:
        def chosen(pair: tuple[str, str] | None) -> None:
            if pair is not None:
                target, draft = pair
                self.load_pair(target, draft or None)

        self.push_screen(PickerScreen(), chosen)

    def action_conversations(self) -> None:
        async def chosen(cid: int | None) -> None:
            if cid == NEW:
                await self.open_conversation(None)
            elif cid is not None:
                await self.open_conversation(cid)

        self.push_screen(ConversationsScreen(), chosen)

    async def action_new_conversation(self) -> None:
        await self.open_conversation(None)

    def action_settings(self) -> None:
        conv = self.store.get_conversation(self.conversation_id) if self.conversation_id else None
        s = self.settings
        current = (
            conv.system_prompt if conv and conv.system_prompt is not None else s.system_prompt,
            conv.max_tokens if conv and conv.max_tokens else s.max_tokens,
            conv.block_size if conv and conv.block_size is not None else s.block_size,
        )

        def saved(values: dict | None) -> None:
            if values is None:
                return
            if self.conversation_id is not None:
                self.store.update_settings(self.conversation_id, **values)
            else:  # no conversation yet: these become the defaults for new ones
                s.system_prompt = values["system_prompt"]
                s.max_tokens = values["max_tokens"]
                s.block_size = values["block_size"]
                self.save_settings()
            self.notify("Settings saved", timeout=2)

        self.push_screen(SettingsScreen(*current), saved)

    def action_export(self) -> Path | None:
        conv = self.store.get_conversation(self.conversation_id) if self.conversation_id else None
        if conv is None:
            self.notify("Nothing to export yet: send a message first.", timeout=3)
            return None
        slug = re.sub(r"[^a-z0-9]+", "-", conv.title.lower()).strip("-")[:40] or "chat"
        path = self.data_dir / "exports" / f"{conv.id}-{slug}.md"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(export_markdown(conv, self.store.messages(conv.id)), encoding="utf-8")
        except OSError as exc:
            self.notify(
                f"Export failed: {exc}. Check that {path.parent} is writable.", severity="error"
            )
            return None
        self.notify(f"Exported to {path}", timeout=5)
        return path

    def action_rename(self) -> None:
        from dflash_tui.screens.modals import TextPrompt

        cid = self.conversation_id
        if cid is None:
            self.notify("Send a message first: new chats are named after it.", timeout=3)
            return
        conv = self.store.get_conversation(cid)

        def done(title: str | None) -> None:
            if title is not None:
                self.store.rename_conversation(cid, title)
                self.sub_title = title

        self.push_screen(TextPrompt("Rename conversation", conv.title if conv else ""), done)

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        chat = self.chat
        yield SystemCommand("Help: key bindings", "Show every key binding (F1)", self.action_help)
        yield SystemCommand(
            "Model pair: pick / download",
            "Registry, downloads, custom pair (F2)",
            self.action_pick_model,
        )
        yield SystemCommand(
            "Conversations: list / search",
            "Open, rename, delete (Ctrl+L)",
            self.action_conversations,
        )
        yield SystemCommand(
            "Conversation: new", "Start an empty chat (Ctrl+N)", self.action_new_conversation
        )
        yield SystemCommand("Conversation: rename", "Rename the open chat", self.action_rename)
        yield SystemCommand(
            "Conversation: export to Markdown", "Write a .md file (Ctrl+E)", self.action_export
        )
        yield SystemCommand(
            "Conversation: settings",
            "System prompt, max tokens, block size (F5)",
            self.action_settings,
        )
        yield SystemCommand("Reply: stop", "Stop streaming, keep the text (Esc)", chat.action_stop)
        yield SystemCommand(
            "Reply: copy last", "Copy the last reply (Ctrl+Y)", chat.action_copy_last
        )
        yield SystemCommand(
            "View: toggle draft colours",
            "Colour draft-accepted tokens (Ctrl+T)",
            chat.action_toggle_colours,
        )
        yield SystemCommand(
            "View: toggle sidebar", "Show/hide live stats (Ctrl+B)", chat.action_toggle_sidebar
        )
        yield SystemCommand(
            "View: toggle compact mode", "Speed line only (Ctrl+O)", chat.action_toggle_compact
        )
