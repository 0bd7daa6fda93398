"""The transaction coordinator actor: hands out producer ids (InitProducerId).

Process: ``txn_coordinator`` (one per broker), started after the group coordinator and
before the request handlers.
Owns: the block of producer-id counters this broker is handing out (``log.producer_ids``:
single broker, a durable block file under the data directory; cluster mode, blocks claimed
in ZooKeeper's ``/latest_producer_id_block``, so no two brokers ever hand out the same id)
and the producer-id key the ids are tagged with (the log actors check the tag: a producer
id no coordinator handed out is refused).

Accepts:
  txn_request {api, body}  forwarded by a request handler; answered straight to the
        client's processor: INIT_PRODUCER_ID {transactional_id, transaction_timeout_ms,
        producer_id, producer_epoch} -> {error_code, producer_id, producer_epoch}.
        Without a transactional id every call gets a new producer id at epoch 0 (as Kafka
        does for an idempotent producer; a producer bumps its epoch itself, KIP-360). With
        one: INVALID_REQUEST (transactions are not built yet; docs/TRANSACTIONS.md).
Sends nothing to other actors. In cluster mode it keeps one ZooKeeper session, opened on
the first block it needs.
"""
from __future__ import annotations

import logging

from odradek.actors.message import Message
from odradek.actors.runtime import Actor
from odradek.log import producer_ids
from odradek.network.protocol import ApiKey, ErrorCode, OdradekError

log = logging.getLogger("odradek.txn")


class TxnCoordinator(Actor):
    def on_start(self) -> None:
        config = self.args["config"]
        self.config = config
        self.data_dir = self.args["data_dir"]
        self.broker_id = int(self.args.get("broker_id", config["broker.id"]))
        self.cluster_mode = bool(config.get("zookeeper.connect"))
        self.zk = None
        self.block: tuple[int, int] | None = None  # (next counter, last counter) of the current block
        self.handed_out = 0
        self.key = producer_ids.load_key(config, self.data_dir)

    def on_stop(self) -> None:
        if self.zk is not None:
            try:
                self.zk.stop()
                self.zk.close()
            except Exception:  # noqa: BLE001 - best effort at shutdown
                pass

    def stats(self) -> dict:
        return {"producer_ids_handed_out": self.handed_out}

    def on_txn_request(self, msg: Message) -> None:
        api, body = msg.get("api"), msg.get("body")
        try:
            if not isinstance(body, dict):
                raise OdradekError("the request body must be a map", ErrorCode.INVALID_REQUEST)
            if api == ApiKey.INIT_PRODUCER_ID:
                self.reply(msg, {"body": self.init_producer_id(body)})
            else:
                raise OdradekError(f"API {api!r} is not served by the transaction coordinator",
                                   ErrorCode.INVALID_REQUEST)
        except OdradekError as exc:
            self.reply_error(msg, exc.code, exc.message)

    def init_producer_id(self, body: dict) -> dict:
        txn_id = body.get("transactional_id")
        if txn_id is not None and not isinstance(txn_id, str):
            raise OdradekError("transactional_id must be a string or null", ErrorCode.INVALID_REQUEST)
        if txn_id:
            raise OdradekError(f"transactional.id {txn_id!r}: transactions are not supported by this broker yet; "
                               f"use an idempotent producer without a transactional id", ErrorCode.INVALID_REQUEST)
        return {"error_code": 0, "producer_id": self.next_producer_id(), "producer_epoch": 0}

    def next_producer_id(self) -> int:
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
            if self.zk is not None:
                try:
                    self.zk.stop()
                    self.zk.close()
                except Exception:  # noqa: BLE001
                    pass
                self.zk = None
            raise OdradekError(f"could not claim a block of producer ids ({exc}); retry",
                               ErrorCode.COORDINATOR_NOT_AVAILABLE) from None
        log.info("producer id block %d..%d claimed", start, end)
        return start, end
