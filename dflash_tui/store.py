"""Conversation history in SQLite, versioned with PRAGMA user_version and forward migrations.

WAL + one short transaction per write means a kill -9 keeps every committed row: the user turn
is committed before generation starts and the reply is rewritten in place while it streams.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

DB_NAME = "history.sqlite3"


def _v1(db: sqlite3.Connection) -> None:
    db.executescript(
        """
        CREATE TABLE conversations (
            id INTEGER PRIMARY KEY,
            title TEXT NOT NULL,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL
        );
        CREATE TABLE messages (
            id INTEGER PRIMARY KEY,
            conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
            role TEXT NOT NULL,
            content TEXT NOT NULL,
            created_at REAL NOT NULL
        );
        CREATE INDEX messages_by_conversation ON messages(conversation_id, id);
        """
    )


def _v2(db: sqlite3.Connection) -> None:
    # Per-conversation settings and reply status/statistics.
    db.executescript(
        """
        ALTER TABLE conversations ADD COLUMN system_prompt TEXT;
        ALTER TABLE conversations ADD COLUMN max_tokens INTEGER;
        ALTER TABLE conversations ADD COLUMN block_size INTEGER;
        ALTER TABLE conversations ADD COLUMN model TEXT;
        ALTER TABLE conversations ADD COLUMN draft TEXT;
        ALTER TABLE messages ADD COLUMN status TEXT NOT NULL DEFAULT 'done';
        ALTER TABLE messages ADD COLUMN stats TEXT;
        """
    )


def _v3(db: sqlite3.Connection) -> None:
    # Per-conversation sampling. NULL temperature/top_p/top_k/min_p: the defaults (rows made
    # before v3); NULL seed: a fresh seed every reply. Adds columns only: no row is rewritten.
    db.executescript(
        """
        ALTER TABLE conversations ADD COLUMN temperature REAL;
        ALTER TABLE conversations ADD COLUMN top_p REAL;
        ALTER TABLE conversations ADD COLUMN top_k INTEGER;
        ALTER TABLE conversations ADD COLUMN min_p REAL;
        ALTER TABLE conversations ADD COLUMN seed INTEGER;
        """
    )


# Index i migrates schema version i -> i + 1. Append only; never edit a shipped migration.
MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [_v1, _v2, _v3]
SCHEMA_VERSION = len(MIGRATIONS)


@dataclass
class Conversation:
    id: int
    title: str
    created_at: float
    updated_at: float
    system_prompt: str | None = None
    max_tokens: int | None = None
    block_size: int | None = None
    model: str | None = None
    draft: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None


# The columns create_conversation and update_settings write (the rest are the store's own).
SETTINGS = ("system_prompt", "max_tokens", "block_size", "model", "draft",
            "temperature", "top_p", "top_k", "min_p", "seed")


@dataclass
class StoredMessage:
    id: int
    conversation_id: int
    role: str
    content: str
    created_at: float
    status: str = "done"  # done | streaming | stopped | error | interrupted
    stats: dict = field(default_factory=dict)


class SchemaTooNew(RuntimeError):
    pass


class HistoryUnavailable(RuntimeError):
    """The history folder or file cannot be written: the message names it and the fix."""


def unwritable(folder: Path, exc: BaseException) -> HistoryUnavailable:
    reason = getattr(exc, "strerror", None) or str(exc)
    return HistoryUnavailable(
        f"cannot write the chat history in {folder} ({reason}). Fix: make that folder "
        "writable, or choose another with --data-dir or $DFLASH_CHAT_DATA_DIR."
    )


def move_aside(path: Path) -> Path:
    """Rename a damaged database (and its WAL/SHM files) beside itself; never delete it."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 1
    while aside.exists():
        n += 1
        aside = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
    for suffix in ("-wal", "-shm"):
        extra = path.with_name(path.name + suffix)
        if extra.exists():
            extra.replace(aside.with_name(aside.name + suffix))
    path.replace(aside)
    return aside


class Store:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.moved_aside: Path | None = None  # where a damaged database went, if one did
        # check_same_thread=False: only the UI thread writes, but tests open/close across loops.
        self.db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        try:
            self.db.row_factory = sqlite3.Row
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.execute("PRAGMA foreign_keys=ON")
            # Reads every page once: damage found here is moved aside (open_default) instead
            # of failing in the middle of a chat.
            check = self.db.execute("PRAGMA quick_check").fetchone()[0]
            if check != "ok":
                raise sqlite3.DatabaseError(f"integrity check: {check}")
            self.migrate()
            self._recover_interrupted()
        except BaseException:
            self.db.close()
            raise

    @classmethod
    def open_default(cls, data_dir: Path) -> Store:
        """The history in `data_dir`. A damaged file is moved aside (kept) and a fresh one
        started (`moved_aside` says where the old one went); an unwritable folder raises
        HistoryUnavailable with the fix."""
        path = data_dir / DB_NAME
        try:
            data_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise unwritable(data_dir, exc) from exc
        try:
            return cls(path)
        except SchemaTooNew:
            raise
        except sqlite3.OperationalError as exc:
            if "locked" in str(exc) or "busy" in str(exc):
                raise HistoryUnavailable(
                    f"the chat history {path} is locked (another dflash-chat using it?). Fix: "
                    "close the other one, or choose another folder with --data-dir."
                ) from exc
            if "malformed" not in str(exc) and "not a database" not in str(exc):
                raise unwritable(data_dir, exc) from exc
            damaged = exc
        except sqlite3.DatabaseError as exc:  # "file is not a database", a failed check
            damaged = exc
        try:
            aside = move_aside(path)
        except OSError as exc:
            raise unwritable(data_dir, exc) from damaged
        store = cls(path)
        store.moved_aside = aside
        return store

    @property
    def version(self) -> int:
        return self.db.execute("PRAGMA user_version").fetchone()[0]

    def migrate(self) -> None:
        current = self.version
        if current > SCHEMA_VERSION:
            raise SchemaTooNew(
                f"{self.path} has schema v{current} but this dflash-chat knows v{SCHEMA_VERSION}: "
                "upgrade dflash-chat (your history is untouched)."
            )
        for version in range(current, SCHEMA_VERSION):
            with self.db:  # one transaction per step: a failed step leaves the prior version
                self.db.execute("BEGIN")
                MIGRATIONS[version](self.db)
                self.db.execute(f"PRAGMA user_version = {version + 1}")

    def _recover_interrupted(self) -> None:
        # A reply still "streaming" at open time was cut by a crash: keep its text, label it.
        self.db.execute("UPDATE messages SET status='interrupted' WHERE status='streaming'")

    def close(self) -> None:
        self.db.close()

    # conversations -------------------------------------------------------------------------

    def create_conversation(self, title: str = "New chat", **settings: object) -> Conversation:
        _check_settings(settings)
        now = time.time()
        cols = ", ".join(("title", "created_at", "updated_at", *SETTINGS))
        marks = ", ".join("?" * (3 + len(SETTINGS)))
        cur = self.db.execute(
            f"INSERT INTO conversations ({cols}) VALUES ({marks})",
            (title, now, now, *(settings.get(k) for k in SETTINGS)),
        )
        return self.get_conversation(cur.lastrowid)  # type: ignore[arg-type, return-value]

    def get_conversation(self, conversation_id: int) -> Conversation | None:
        row = self.db.execute(
            "SELECT * FROM conversations WHERE id = ?", (conversation_id,)
        ).fetchone()
        return Conversation(**dict(row)) if row else None

    def list_conversations(self, search: str = "") -> list[Conversation]:
        if search:
            pattern = f"%{search}%"
            rows = self.db.execute(
                "SELECT DISTINCT c.* FROM conversations c LEFT JOIN messages m"
                " ON m.conversation_id = c.id WHERE c.title LIKE ? OR m.content LIKE ?"
                " ORDER BY c.updated_at DESC, c.id DESC",
                (pattern, pattern),
            )
        else:
            rows = self.db.execute("SELECT * FROM conversations ORDER BY updated_at DESC, id DESC")
        return [Conversation(**dict(r)) for r in rows]

    def rename_conversation(self, conversation_id: int, title: str) -> None:
        self.db.execute(
            "UPDATE conversations SET title = ?, updated_at = ? WHERE id = ?",
            (title.strip() or "Untitled", time.time(), conversation_id),
        )

    def update_settings(self, conversation_id: int, **settings: object) -> None:
        _check_settings(settings)
        if not settings:
            return
        cols = ", ".join(f"{k} = ?" for k in settings)
        self.db.execute(
            f"UPDATE conversations SET {cols} WHERE id = ?", (*settings.values(), conversation_id)
        )

    def delete_conversation(self, conversation_id: int) -> None:
        self.db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))

    # messages ------------------------------------------------------------------------------

    def add_message(
        self, conversation_id: int, role: str, content: str, status: str = "done"
    ) -> StoredMessage:
        now = time.time()
        with self.db:
            self.db.execute("BEGIN")
            cur = self.db.execute(
                "INSERT INTO messages (conversation_id, role, content, created_at, status)"
                " VALUES (?, ?, ?, ?, ?)",
                (conversation_id, role, content, now, status),
            )
            self.db.execute(
                "UPDATE conversations SET updated_at = ? WHERE id = ?", (now, conversation_id)
            )
        return StoredMessage(cur.lastrowid, conversation_id, role, content, now, status)  # type: ignore[arg-type]

    def update_message(
        self,
        message_id: int,
        content: str,
        status: str | None = None,
        stats: dict | None = None,
    ) -> None:
        self.db.execute(
            "UPDATE messages SET content = ?, status = COALESCE(?, status),"
            " stats = COALESCE(?, stats) WHERE id = ?",
            (content, status, json.dumps(stats) if stats is not None else None, message_id),
        )

    def message_counts(self) -> dict[int, int]:
        """{conversation id: number of messages}, in one query."""
        rows = self.db.execute(
            "SELECT conversation_id, COUNT(*) FROM messages GROUP BY conversation_id"
        )
        return {cid: n for cid, n in rows}

    def delete_messages(self, message_ids: list[int]) -> None:
        with self.db:
            self.db.execute("BEGIN")
            self.db.executemany("DELETE FROM messages WHERE id = ?", [(i,) for i in message_ids])

    def messages(self, conversation_id: int) -> list[StoredMessage]:
        rows = self.db.execute(
            "SELECT * FROM messages WHERE conversation_id = ? ORDER BY id", (conversation_id,)
        )
        out = []
        for r in rows:
            d = dict(r)
            d["stats"] = json.loads(d["stats"]) if d.get("stats") else {}
            out.append(StoredMessage(**d))
        return out


def _check_settings(settings: dict[str, object]) -> None:
    unknown = set(settings) - set(SETTINGS)
    if unknown:
        raise ValueError(f"unknown conversation settings: {sorted(unknown)}")


def export_markdown(conversation: Conversation, messages: list[StoredMessage]) -> str:
    lines = [f"# {conversation.title}", ""]
    if conversation.system_prompt:
        lines += ["> **System:** " + conversation.system_prompt.replace("\n", "\n> "), ""]
    for m in messages:
        heading = {"user": "You", "assistant": "Assistant", "system": "System"}.get(m.role, m.role)
        suffix = f" _({m.status})_" if m.status not in ("done",) else ""
        lines += [f"## {heading}{suffix}", "", m.content.rstrip(), ""]
    return "\n".join(lines).rstrip() + "\n"
