"""SQL bulk writes through SQLAlchemy 2's asyncio API (extra ``[sqlalchemy]``; bring your driver: asyncpg,
aiosqlite, ...). 0.2.2's path stays: ``async_batcher.sqlalchemy.write.AsyncSqlalchemyWriteBatcher``."""

from __future__ import annotations

from async_batcher.sqlalchemy.write import AsyncSqlalchemyWriteBatcher, CommitUnknownError, RowNotFoundError

__all__ = ["AsyncSqlalchemyWriteBatcher", "CommitUnknownError", "RowNotFoundError"]
