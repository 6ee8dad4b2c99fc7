//! The sink's side of the consumer loop ([`podstream_bus::consume`]): each command handed to
//! its TI's lane as it arrives (waiting while that lane is full), and each lane's committed
//! batch reported and acked.

use podstream_bus::consume::{DeadLetters, Decoded, Delivery, Handler, HandlerStopped};
use podstream_bus::in_flight::Held;
use podstream_proto::Command;
use prost::Message as _;
use tokio::sync::mpsc;

use super::report;
use crate::item::Item;
use crate::lanes::{Applied, Lanes};
use crate::summary::Summary;

/// Commands to the lanes, committed batches back.
pub(super) struct CommandHandler {
    /// The lanes; taken when the sink drains.
    pub lanes: Option<Lanes<Held>>,
    /// Each lane's committed batches; ends once the lanes are closed and empty.
    pub applied: mpsc::UnboundedReceiver<Applied<Held>>,
    /// Where a command the database refuses goes.
    pub dead: DeadLetters,
    /// What the sink did.
    pub summary: Summary,
}

impl Handler for CommandHandler {
    type Item = Command;
    type Done = Applied<Held>;

    fn decode(&self, message: &async_nats::jetstream::Message) -> Decoded<Command> {
        match Command::decode(message.payload.as_ref()) {
            Ok(command) => Decoded::Item(command),
            Err(error) => Decoded::Dead(format!("not a Command: {error}")),
        }
    }

    /// Always: a full lane makes [`Handler::take`] wait instead.
    fn has_room(&self) -> bool {
        true
    }

    async fn take(&mut self, deliveries: Vec<Delivery<Command>>) -> Result<(), HandlerStopped> {
        let Some(lanes) = &self.lanes else {
            return Err(HandlerStopped("the sink's lanes are closed".to_owned()));
        };
        for Delivery {
            item: command,
            message,
            sequence,
        } in deliveries
        {
            let sequence = (sequence != 0).then_some(sequence);
            lanes
                .send(Item { command, sequence }, message)
                .await
                .map_err(|stopped| HandlerStopped(stopped.to_string()))?;
        }
        Ok(())
    }

    async fn finished(&mut self) -> Option<Applied<Held>> {
        self.applied.recv().await
    }

    async fn after(&mut self, batch: Applied<Held>) {
        report::finish(&self.dead, batch, &mut self.summary).await;
    }

    /// Everything handed to a lane is applied and acked: the batches end when the last lane
    /// has finished.
    async fn drain(&mut self) {
        let closing = self.lanes.take().map(|lanes| tokio::spawn(lanes.close()));
        while let Some(batch) = self.finished().await {
            self.after(batch).await;
        }
        if let Some(Err(panic)) = match closing {
            Some(closing) => Some(closing.await),
            None => None,
        } {
            tracing::error!(%panic, "closing the sink lanes panicked");
        }
    }
}
