// SPDX-License-Identifier: MIT OR Apache-2.0
//! A device that completes every request at once and moves no data: for measuring the
//! engine alone.

use crate::{
    BlockDevice, BufferAccess, Completion, CompletionQueue, Geometry, IoOp, IoRequest, IoStatus,
    SubmitError,
};

#[derive(Debug)]
pub struct NullDisk {
    geometry: Geometry,
    completions: CompletionQueue,
}

impl NullDisk {
    pub fn new(geometry: Geometry, queue_depth: usize) -> Self {
        Self {
            geometry,
            completions: CompletionQueue::with_capacity(queue_depth),
        }
    }
}

impl BlockDevice for NullDisk {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    fn queue_depth(&self) -> usize {
        self.completions.capacity()
    }

    fn submit(
        &mut self,
        request: &IoRequest<'_>,
        _buffers: &dyn BufferAccess,
    ) -> Result<(), SubmitError> {
        let len: u64 = match request.op {
            IoOp::Discard { .. } => request.nr_sectors,
            IoOp::Flush => 0,
            IoOp::Read | IoOp::Write => request.nr_sectors,
        };
        if !request.fits(len, self.geometry.sectors) {
            return Err(SubmitError::Invalid);
        }
        self.completions.push(Completion {
            tag: request.tag,
            status: IoStatus::Ok,
        })
    }

    fn poll_completions(&mut self, sink: &mut dyn FnMut(Completion)) -> usize {
        self.completions.drain(sink)
    }
}
