"""The producer ids a transaction coordinator hands out (InitProducerId).

Process: ``txn_coordinator`` (a plain object its actor owns, ``coordinator.txn_coordinator``).
Owns: the block of producer-id counters this broker is handing out (``log.producer_ids``:
single broker, a durable block file under the data directory; cluster mode, blocks claimed
in ZooKeeper's ``/latest_producer_id_block``, so no two brokers ever hand out the same id),
the producer-id key the ids are tagged with (the log actors check the tag: a producer id no
coordinator handed out is refused) and, in cluster mode, a ZooKeeper session, opened on the
first block it needs.
Collaborators, handed in: the config, the data directory, the broker's id.
"""
from __future__ import annotations

import logging

from odradek.log import producer_ids
from odradek.core.protocol import ErrorCode, OdradekError

log = logging.getLogger("odradek.txn")


class ProducerIds:
    def __init__(self, config, data_dir: str, broker_id: int, cluster_mode: bool):
        self.config, self.data_dir, self.broker_id, self.cluster_mode = config, data_dir, broker_id, cluster_mode
        self.key = producer_ids.load_key(config, data_dir)
        self.block: tuple[int, int] | None = None  # (next counter, last counter) of the current block
        self.handed_out = 0
        self.zk = None

    def next(self) -> int:
        if self.block is None or self.block[0] > self.block[1]:
            self.block = self._claim_block()
        counter = self.block[0]
        self.block = (counter + 1, self.block[1])
        self.handed_out += 1
        return producer_ids.make_producer_id(counter, self.key)

    def _claim_block(self) -> tuple[int, int]:
        try:
            if self.cluster_mode:
                if self.zk is None:
                    self.zk = producer_ids.zk_client(self.config)
                start, end = producer_ids.ZkBlockAllocator(self.zk, self.broker_id).next_block()
            else:
                start, end = producer_ids.FileBlockAllocator(self.data_dir).next_block()
        except OverflowError as exc:
            raise OdradekError(str(exc), ErrorCode.UNKNOWN_SERVER_ERROR) from None
        except Exception as exc:  # noqa: BLE001 - disk or ZooKeeper: retriable for the client
            log.warning("could not claim a block of producer ids: %s", exc)
            self.close()
            raise OdradekError(f"could not claim a block of producer ids ({exc}); retry",
                               ErrorCode.COORDINATOR_NOT_AVAILABLE) from None
        log.info("producer id block %d..%d claimed", start, end)
        return start, end

    def close(self) -> None:
        if self.zk is not None:
            try:
                self.zk.stop()
                self.zk.close()
            except Exception:  # noqa: BLE001 - best effort
                pass
            self.zk = None
