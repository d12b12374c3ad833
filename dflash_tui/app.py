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
from dflash_tui.config import ChatSettings
from dflash_tui.messages import (
    DeleteConversation,
    EngineReady,
    LoadPair,
    OpenConversation,
    RenameConversation,
    SaveSettings,
    ToggleView,
)
from dflash_tui.screens.chat import ChatScreen
from dflash_tui.screens.conversations import ConversationsScreen
from dflash_tui.screens.help import BindingRow, HelpScreen, rows_of
from dflash_tui.screens.modals import SettingsScreen, TextPrompt
from dflash_tui.screens.picker import PickerScreen
from dflash_tui.store import Store, StoredMessage, export_markdown
from dflash_tui.widgets.prompt import PromptInput
from dflash_tui.widgets.transcript import MessageView
from dflash_tui.worker import EngineWorker


def title_from(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else "New chat"
    return line[:48] + ("…" if len(line) > 48 else "")


class DFlashChatApp(App[None]):
    """The one owner of the app's state (the open conversation, the settings, the engine
    worker); its screens reach that state through dflash_tui.host.ChatHost."""

    TITLE = "dflash-chat"
    SUB_TITLE = "New chat"
    ENABLE_COMMAND_PALETTE = True
    BINDINGS = [
        Binding("ctrl+q", "quit", "Quit", id="app.quit", priority=True),
        # Ours rather than Textual's implicit one, so it has an id and can be rebound.
        Binding(
            "ctrl+p", "command_palette", "palette", id="app.command_palette",
            priority=True, show=False,
        ),
        Binding("f1", "help", "Help", id="app.help"),
        Binding("f2", "pick_model", "Models", id="app.pick_model"),
        Binding("ctrl+l", "conversations", "Chats", id="app.conversations"),
        Binding("ctrl+n", "new_conversation", "New", id="app.new_conversation"),
        Binding("f5", "settings", "Settings", id="app.settings"),
        # priority: the prompt's TextArea would take Ctrl+E (end of line) first.
        Binding("ctrl+e", "export", "Export", id="app.export", priority=True, show=False),
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
        self.info: dict = {}  # the loaded pair's describe(); {} until the engine is ready
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
        self.apply_keymap()
        self.worker.start()
        self.load_pair(self.model, self.draft)
        if self.config_problem:
            self.notify(self.config_problem, severity="warning", timeout=15, markup=False)
        if self.store.moved_aside is not None:
            self.notify(
                f"The chat history was damaged and could not be read. It was moved to "
                f"{self.store.moved_aside} (kept, not deleted); a fresh history starts here.",
                title="History",
                severity="warning",
                timeout=30,
                markup=False,
            )

    def apply_keymap(self) -> None:
        """The config file's [keymap] (binding id -> keys) over the default bindings."""
        known = {row[0] for row in binding_rows()}
        keymap = self.settings.keymap
        unknown = sorted(set(keymap) - known)
        self.set_keymap({k: v for k, v in keymap.items() if k in known})
        if unknown:
            self.notify(
                f"Config file {self.config_file}: [keymap] has no binding "
                f"{', '.join(unknown)}; F1 lists the binding ids.",
                severity="warning",
                timeout=15,
                markup=False,
            )

    def watch_theme(self, theme: str) -> None:
        if theme != self.settings.theme:
            self.settings.theme = theme
            self.save_settings()

    def save_settings(self) -> None:
        if self.config_problem:
            # Never overwrite a file we could not read fully: the user's fix would be lost.
            return
        try:
            config.save_settings(self.settings, self.config_file)
        except OSError as exc:
            self.notify(
                f"Could not save settings to {self.config_file}: {exc}", severity="error",
                markup=False,
            )

    # the current conversation: the app is its one owner -------------------------------------

    def effective(self) -> ChatSettings:
        """The open conversation's settings, falling back to the defaults for unset ones
        (a conversation's seed is its own: unset means a fresh seed every reply)."""
        s = self.settings
        conv = self.store.get_conversation(self.conversation_id) if self.conversation_id else None
        if conv is None:
            return ChatSettings(s.system_prompt, s.max_tokens, s.block_size, s.temperature,
                                s.top_p, s.top_k, s.min_p, s.seed)

        def own(name: str) -> object:
            value = getattr(conv, name)
            return value if value is not None else getattr(s, name)

        return ChatSettings(
            conv.system_prompt if conv.system_prompt is not None else s.system_prompt,
            conv.max_tokens or s.max_tokens,
            conv.block_size if conv.block_size is not None else s.block_size,
            own("temperature"), own("top_p"), own("top_k"), own("min_p"), conv.seed,
        )

    def begin_conversation(self, first_message: str) -> int:
        """The conversation a message goes to: the open one, or a new one named after it."""
        if self.conversation_id is None:
            s = self.settings
            conv = self.store.create_conversation(
                title_from(first_message),
                system_prompt=s.system_prompt,
                max_tokens=s.max_tokens,
                block_size=s.block_size,
                **{k: getattr(s, k) for k in config.SAMPLING},
            )
            self._set_current(conv.id, conv.title)
        assert self.conversation_id is not None
        # Record the pair this conversation talks to (the last one used, shown in Ctrl+L).
        if self.info:
            self.store.update_settings(
                self.conversation_id, model=self.info.get("target"), draft=self.info.get("draft")
            )
        return self.conversation_id

    # The open conversation's turns: the chat screen draws them, the app writes them.

    def add_turn(self, role: str, content: str, status: str = "done") -> StoredMessage:
        assert self.conversation_id is not None, "begin_conversation() first"
        return self.store.add_message(self.conversation_id, role, content, status=status)

    def save_turn(
        self, message_id: int, content: str, status: str | None = None, stats: dict | None = None
    ) -> None:
        self.store.update_message(message_id, content, status=status, stats=stats)

    def drop_turns(self, message_ids: list[int]) -> None:
        self.store.delete_messages(message_ids)

    def _set_current(self, conversation_id: int | None, title: str) -> None:
        self.conversation_id = conversation_id
        self.sub_title = title

    async def open_conversation(self, conversation_id: int | None) -> None:
        conv = self.store.get_conversation(conversation_id) if conversation_id else None
        await self.chat.stop_reply()
        self._set_current(conv.id if conv else None, conv.title if conv else "New chat")
        await self.chat.show_conversation(self.conversation_id)

    def load_pair(self, model: str | None, draft: str | None) -> None:
        self.model, self.draft = model, draft
        self.info = {}
        self.worker.submit_load(model, draft, self.effective().block_size)

    async def on_unmount(self) -> None:
        self.worker.shutdown()
        self.store.close()

    # messages from screens ------------------------------------------------------------------

    async def on_open_conversation(self, message: OpenConversation) -> None:
        await self.open_conversation(message.conversation_id)

    def on_rename_conversation(self, message: RenameConversation) -> None:
        self.store.rename_conversation(message.conversation_id, message.title)
        if message.conversation_id == self.conversation_id:
            conv = self.store.get_conversation(message.conversation_id)
            self.sub_title = conv.title if conv else message.title
        self._refresh_lists()

    async def on_delete_conversation(self, message: DeleteConversation) -> None:
        self.store.delete_conversation(message.conversation_id)
        self._refresh_lists()
        if message.conversation_id == self.conversation_id:
            await self.open_conversation(None)

    def _refresh_lists(self) -> None:
        for screen in self.screen_stack:
            if isinstance(screen, ConversationsScreen):
                screen.reload()

    def on_toggle_view(self, message: ToggleView) -> None:
        s = self.settings
        setattr(s, message.setting, not getattr(s, message.setting))
        self.chat.apply_view()
        self.save_settings()

    def on_load_pair(self, message: LoadPair) -> None:
        self.load_pair(message.model, message.draft)

    def on_engine_ready(self, event: EngineReady) -> None:
        # Bubbles up from the chat screen, which shows it; the app keeps what was loaded.
        self.info = dict(event.info)

    # actions --------------------------------------------------------------------------------

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(binding_rows(self.settings.keymap), self.config_file))

    def action_pick_model(self) -> None:
        # posts LoadPair when a pair is chosen
        self.push_screen(PickerScreen(loaded_target=self.info.get("target")))

    def action_conversations(self) -> None:
        self.push_screen(ConversationsScreen())  # posts OpenConversation when one is chosen

    async def action_new_conversation(self) -> None:
        await self.open_conversation(None)

    def action_settings(self) -> None:
        def saved(values: dict | None) -> None:
            if values is not None:
                self.post_message(SaveSettings(values))

        self.push_screen(SettingsScreen(self.effective()), saved)

    def on_save_settings(self, message: SaveSettings) -> None:
        """The settings screen's values: the open conversation's, or (no conversation yet)
        the defaults for new ones."""
        values = message.values
        if self.conversation_id is not None:
            self.store.update_settings(self.conversation_id, **values)
            where = "this conversation"
        else:
            for name, value in values.items():
                setattr(self.settings, name, value)
            self.save_settings()
            where = "new conversations"
        self.chat.show_settings(self.effective())
        self.notify(f"Settings saved for {where}", timeout=2, markup=False)

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
                f"Export failed: {exc}. Check that {path.parent} is writable.", severity="error",
                markup=False,
            )
            return None
        self.notify(f"Exported to {path}", timeout=5, markup=False)
        return path

    def action_rename(self) -> None:
        cid = self.conversation_id
        if cid is None:
            self.notify("Send a message first: new chats are named after it.", timeout=3)
            return
        conv = self.store.get_conversation(cid)

        def done(title: str | None) -> None:
            if title is not None:
                self.post_message(RenameConversation(cid, title))

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
            "System prompt, max tokens, block size, temperature, top-p, seed (F5)",
            self.action_settings,
        )
        yield SystemCommand("Reply: stop", "Stop streaming, keep the text (Esc)", chat.action_stop)
        yield SystemCommand(
            "Reply: copy last", "Copy the last reply (Ctrl+Y)", chat.action_copy_last
        )
        yield SystemCommand(
            "Reply: regenerate", "Replace the last reply with a new one (Ctrl+R)",
            chat.action_regenerate,
        )
        yield SystemCommand(
            "Message: edit last", "Edit and resend your last message (Ctrl+G)",
            chat.action_edit_last,
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


def binding_rows(keymap: dict[str, str] | None = None) -> list[BindingRow]:
    """(id, keys, action, where) for every binding with an id: what F1 lists and [keymap]
    may rebind; `keymap` overrides keys by id."""
    return rows_of(
        (
            ("everywhere", DFlashChatApp),
            ("chat", ChatScreen),
            ("prompt", PromptInput),
            ("focused message", MessageView),
            ("conversations", ConversationsScreen),
            ("model picker", PickerScreen),
            ("settings", SettingsScreen),
        ),
        keymap,
    )
