"""SNS: batch ``Publish`` into ``PublishBatch`` (:class:`AsyncSnsPublishBatcher`). Needs the ``[aws]`` extra."""

from __future__ import annotations

from async_batcher.aws.sns.publish import AsyncSnsPublishBatcher, SnsMessage

__all__ = ["AsyncSnsPublishBatcher", "SnsMessage"]
