"""Kinesis Data Streams: batch ``PutRecord`` into ``PutRecords`` (:class:`AsyncKinesisPutBatcher`). Needs the
``[aws]`` extra."""

from __future__ import annotations

from async_batcher.aws.kinesis.put import AsyncKinesisPutBatcher, KinesisPutResult, KinesisRecord

__all__ = ["AsyncKinesisPutBatcher", "KinesisPutResult", "KinesisRecord"]
