//! Reads input ahead on worker threads, in blocks of whole lines, and reads each line once
//! there (`decide`'s projection), so the thread that decides in order only decides.
//!
//! Workers take turns at the input: each reads the next block under a lock, queues a slot
//! for it in input order, and fills the slot once it has projected the block's lines. The
//! deciding thread reads the blocks back as one [`BufRead`] and asks
//! [`Projections::take`] for a line's result by its line number, as
//! [`JsonFrames::next_with`](crate::offline::json_stream::JsonFrames::next_with) numbers them.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::io::{self, BufRead, Read};
use std::rc::Rc;
use std::sync::mpsc::{Receiver, SyncSender, TryRecvError, sync_channel};
use std::sync::{Arc, Mutex};

use crate::offline::json_stream::one_object;

/// How much a worker reads at once: a few hundred events. Smaller blocks hand over more often
/// (each handover may wake a thread), larger ones hold more memory in flight.
const READ_BYTES: usize = 384 * 1024;

/// The most worker threads: beyond a few, the deciding thread is the bound.
const MAX_WORKERS: usize = 4;

/// A value's result: the number of its first line (from 1), its length in bytes (its lines
/// whole, newlines included), and what the projection made of it.
type Projected<T> = (usize, usize, T);

/// One block of input and the results of its lines.
struct Block<T> {
    bytes: Vec<u8>,
    projected: Vec<Projected<T>>,
}

/// A block as read, before its lines are projected.
struct RawBlock {
    bytes: Vec<u8>,
    /// The number of the line the block's first byte is on.
    first_line: usize,
    /// The block starts inside a line that began in an earlier block.
    starts_mid_line: bool,
    /// The block ends the input, so its last line is whole without a newline.
    ends_input: bool,
}

/// The input, shared by the workers.
struct Input {
    reader: Box<dyn Read + Send>,
    /// What each read fills, [`READ_BYTES`] long.
    scratch: Vec<u8>,
    /// The start of a line left over from the last read.
    carry: Vec<u8>,
    next_line: usize,
    mid_line: bool,
    done: bool,
    /// Lines longer than this are never projected (the framer refuses them) and a block
    /// without a newline is cut here, so no line is buffered whole.
    limit: usize,
}

impl Input {
    /// The next block of whole lines (or, for a line over the limit, of part of one).
    fn next_block(&mut self) -> io::Result<Option<RawBlock>> {
        let mut bytes = Vec::with_capacity(self.carry.len() + READ_BYTES);
        bytes.append(&mut self.carry);
        loop {
            let before = bytes.len();
            // Read into the scratch and copy what came: a short read (a pipe) costs its size.
            let read = loop {
                match self.reader.read(&mut self.scratch) {
                    Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
                    read => break read,
                }
            };
            let read = match read {
                Ok(read) => read,
                Err(err) => {
                    self.done = true;
                    return Err(err);
                }
            };
            bytes.extend_from_slice(&self.scratch[..read]);
            if read == 0 {
                self.done = true;
                return Ok((!bytes.is_empty()).then(|| self.block(bytes, true)));
            }
            if let Some(last) = memchr::memrchr(b'\n', &bytes[before..]) {
                let end = before + last + 1;
                self.carry = bytes[end..].to_vec();
                bytes.truncate(end);
                return Ok(Some(self.block(bytes, false)));
            }
            if bytes.len() > self.limit {
                return Ok(Some(self.block(bytes, false)));
            }
        }
    }

    fn block(&mut self, bytes: Vec<u8>, ends_input: bool) -> RawBlock {
        let block = RawBlock {
            first_line: self.next_line,
            starts_mid_line: self.mid_line,
            ends_input,
            bytes,
        };
        self.next_line += memchr::memchr_iter(b'\n', &block.bytes).count();
        self.mid_line = block.bytes.last() != Some(&b'\n');
        block
    }
}

impl RawBlock {
    /// Where the line starting at `start` ends (past its newline; the block's end for the
    /// input's last line), if it is whole in the block.
    fn line_end(&self, start: usize) -> Option<usize> {
        match memchr::memchr(b'\n', &self.bytes[start..]) {
            Some(at) => Some(start + at + 1),
            None => (self.ends_input && start < self.bytes.len()).then_some(self.bytes.len()),
        }
    }

    /// A pretty-printed value that opens on the line at `start` (a lone `{`): where it ends
    /// (past the newline of its lone closing `}` at the line's start) and how many lines it
    /// spans, when that is in the block and within `limit` bytes. Inside a value a raw
    /// newline is never in a string and nested brackets are indented, so the first line that
    /// is `}` alone closes the top-level value: one search finds it, not one per line.
    fn pretty_value(&self, start: usize, limit: usize) -> Option<(usize, usize)> {
        let within = self
            .bytes
            .len()
            .min(start.saturating_add(limit).saturating_add(1));
        let mut from = start;
        loop {
            let closer = from + closing_line(&self.bytes[from..within])? + 1;
            let next = self.line_end(closer)?;
            if next > within {
                return None;
            }
            if self.bytes[closer..next].trim_ascii_end() == b"}" {
                let lines = memchr::memchr_iter(b'\n', &self.bytes[start..next]).count()
                    + usize::from(self.bytes[next - 1] != b'\n');
                return Some((next, lines));
            }
            from = closer;
        }
    }

    /// Projects every value of the block that may be one object: a whole line, or a
    /// pretty-printed value whose lines are all in the block (kubectl's `-o json -w`).
    fn project<T>(self, project: fn(&str) -> Option<T>, limit: usize) -> Block<T> {
        let mut projected = Vec::new();
        let mut start = 0;
        let mut line_no = self.first_line;
        if self.starts_mid_line {
            // The rest of a line that began in an earlier block: never projected.
            match self.line_end(0) {
                Some(end) => (start, line_no) = (end, line_no + 1),
                None => start = self.bytes.len(),
            }
        }
        while let Some(end) = self.line_end(start) {
            let line = &self.bytes[start..end];
            if line.len() <= limit + 1
                && let Some(result) = one_object(line).and_then(project)
            {
                projected.push((line_no, line.len(), result));
            } else if line.trim_ascii_end() == b"{"
                && let Some((value_end, lines)) = self.pretty_value(start, limit)
                && let Some(result) = std::str::from_utf8(&self.bytes[start..value_end])
                    .ok()
                    .and_then(project)
            {
                projected.push((line_no, value_end - start, result));
                (start, line_no) = (value_end, line_no + lines);
                continue;
            }
            start = end;
            line_no += 1;
        }
        Block {
            bytes: self.bytes,
            projected,
        }
    }
}

/// Where the next line that starts with `}` begins in `bytes`, less one (at its newline).
fn closing_line(bytes: &[u8]) -> Option<usize> {
    static CLOSER: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
        std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"\n}"));
    CLOSER.find(bytes)
}

/// The deciding thread's side: the input in order, as one buffered reader.
pub struct ReadAhead<T> {
    slots: Receiver<Receiver<io::Result<Block<T>>>>,
    next_slot: Option<Receiver<io::Result<Block<T>>>>,
    bytes: Vec<u8>,
    at: usize,
    projections: Projections<T>,
}

/// The projected lines of the blocks read so far, by line number.
pub struct Projections<T>(Rc<RefCell<VecDeque<Projected<T>>>>);

impl<T> Clone for Projections<T> {
    fn clone(&self) -> Self {
        Projections(Rc::clone(&self.0))
    }
}

impl<T> Projections<T> {
    /// The result of the value starting on line `line_no` and the bytes it spans, if the
    /// projection took it and those bytes are within the `available` ones (the reader's
    /// buffer from that line on); results for earlier lines (never asked for: they were
    /// inside a framed value) are dropped.
    pub fn take(&self, line_no: usize, available: usize) -> Option<(T, usize)> {
        let mut queue = self.0.borrow_mut();
        while queue.front().is_some_and(|(line, _, _)| *line < line_no) {
            queue.pop_front();
        }
        match queue.front() {
            Some((line, _, _)) if *line == line_no => queue
                .pop_front()
                .filter(|(_, len, _)| *len <= available)
                .map(|(_, len, result)| (result, len)),
            _ => None,
        }
    }
}

impl<T: Send + 'static> ReadAhead<T> {
    /// Starts reading `reader` on one worker per core (at most [`MAX_WORKERS`]), each line of up
    /// to `limit` bytes read by `project` there. The workers stop at the end of the input, at
    /// its first error, or when this reader is dropped and they next look.
    pub fn spawn(
        reader: Box<dyn Read + Send>,
        project: fn(&str) -> Option<T>,
        limit: usize,
    ) -> io::Result<Self> {
        let workers = std::thread::available_parallelism()
            .map_or(1, usize::from)
            .min(MAX_WORKERS);
        let input = Arc::new(Mutex::new(Input {
            reader,
            scratch: vec![0; READ_BYTES],
            carry: Vec::new(),
            next_line: 1,
            mid_line: false,
            done: false,
            limit,
        }));
        let (slots_tx, slots) = sync_channel(workers);
        for index in 0..workers {
            let input = Arc::clone(&input);
            let slots_tx = slots_tx.clone();
            std::thread::Builder::new()
                .name(format!("read-ahead-{index}"))
                .spawn(move || work(&input, &slots_tx, project, limit))?;
        }
        Ok(ReadAhead {
            slots,
            next_slot: None,
            bytes: Vec::new(),
            at: 0,
            projections: Projections(Rc::default()),
        })
    }

    /// The projected lines, to look up as the framer offers them.
    pub fn projections(&self) -> Projections<T> {
        self.projections.clone()
    }

    /// Whether more input is here without waiting for the workers to read it.
    pub fn has_ready_input(&mut self) -> bool {
        if self.at < self.bytes.len() || self.next_slot.is_some() {
            return true;
        }
        match self.slots.try_recv() {
            Ok(slot) => {
                self.next_slot = Some(slot);
                true
            }
            Err(TryRecvError::Empty | TryRecvError::Disconnected) => false,
        }
    }
}

/// One worker: read a block in turn, queue its slot, project it, fill the slot.
fn work<T>(
    input: &Mutex<Input>,
    slots: &SyncSender<Receiver<io::Result<Block<T>>>>,
    project: fn(&str) -> Option<T>,
    limit: usize,
) {
    loop {
        let (fill, slot) = sync_channel(1);
        let read = {
            let Ok(mut input) = input.lock() else {
                return;
            };
            if input.done {
                return;
            }
            let read = match input.next_block() {
                Ok(None) => return,
                Ok(Some(raw)) => Ok(raw),
                Err(err) => Err(err),
            };
            // Queued under the lock: slots are in input order.
            if slots.send(slot).is_err() {
                return;
            }
            read
        };
        // After an error the input is done; the other workers stop at their next turn.
        let _ = fill.send(read.map(|raw| raw.project(project, limit)));
    }
}

impl<T> Read for ReadAhead<T> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let available = self.fill_buf()?;
        let read = available.len().min(buf.len());
        buf[..read].copy_from_slice(&available[..read]);
        self.consume(read);
        Ok(read)
    }
}

impl<T> BufRead for ReadAhead<T> {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        while self.at >= self.bytes.len() {
            let slot = match self.next_slot.take() {
                Some(slot) => slot,
                None => match self.slots.recv() {
                    Ok(slot) => slot,
                    // Every worker has stopped: the end of the input.
                    Err(_) => return Ok(&[]),
                },
            };
            let block = slot
                .recv()
                .map_err(|_| io::Error::other("a read-ahead worker stopped before its block"))??;
            self.projections.0.borrow_mut().extend(block.projected);
            self.bytes = block.bytes;
            self.at = 0;
        }
        Ok(&self.bytes[self.at..])
    }

    fn consume(&mut self, amount: usize) {
        self.at = (self.at + amount).min(self.bytes.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader handing out `chunk` bytes per read, as a pipe may.
    struct Trickle {
        bytes: Vec<u8>,
        at: usize,
        chunk: usize,
    }

    impl Read for Trickle {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let read = self.chunk.min(buf.len()).min(self.bytes.len() - self.at);
            buf[..read].copy_from_slice(&self.bytes[self.at..self.at + read]);
            self.at += read;
            Ok(read)
        }
    }

    /// The text of each line holding `"take"`, projected.
    fn take_marked(line: &str) -> Option<String> {
        line.contains("take").then(|| line.to_owned())
    }

    fn read_all(input: &str, chunk: usize, limit: usize) -> (String, Vec<Option<String>>) {
        let reader = Trickle {
            bytes: input.as_bytes().to_vec(),
            at: 0,
            chunk,
        };
        let mut ahead = ReadAhead::spawn(Box::new(reader), take_marked, limit).unwrap();
        let projections = ahead.projections();
        let mut text = String::new();
        ahead.read_to_string(&mut text).unwrap();
        let lines = input.split_inclusive('\n').count();
        let taken = (1..=lines)
            .map(|line| projections.take(line, usize::MAX).map(|(value, _)| value))
            .collect();
        (text, taken)
    }

    /// Pretty-printed values (kubectl's `-o json -w`) are projected whole where all their
    /// lines are in one block, at their first line's number, with the bytes they span.
    #[test]
    fn pretty_printed_values_are_projected_whole() {
        let value = |i: usize| {
            format!("{{\n    \"take\": {i},\n    \"inner\": {{\n        \"a\": 1\n    }}\n}}\n")
        };
        let input: String = (0..500).map(value).collect();
        let lines_each = value(0).lines().count();
        for chunk in [7, 4096, READ_BYTES * 2] {
            let reader = Trickle {
                bytes: input.as_bytes().to_vec(),
                at: 0,
                chunk,
            };
            let mut ahead = ReadAhead::spawn(Box::new(reader), take_marked, 1 << 20).unwrap();
            let projections = ahead.projections();
            let mut text = String::new();
            ahead.read_to_string(&mut text).unwrap();
            assert_eq!(text, input);
            let mut whole = 0;
            for i in 0..500 {
                if let Some((taken, len)) = projections.take(1 + i * lines_each, usize::MAX) {
                    assert_eq!(taken, value(i), "value {i}, chunk {chunk}");
                    assert_eq!(len, value(i).len());
                    whole += 1;
                }
            }
            // A value cut by a block's end is left to the framer; the rest are whole. (Reads of
            // a few bytes end a block at nearly every line, so no value is whole in one.)
            if chunk >= 4096 {
                assert!(whole >= 490, "{whole} of 500 with chunk {chunk}");
            }
        }
        // A value longer than the limit is never projected.
        let (_, taken) = read_all(&value(1), 4096, 10);
        assert!(taken.iter().all(Option::is_none));
    }

    #[test]
    fn lines_come_back_whole_in_order_with_their_numbers() {
        let input: String = (0..2000)
            .map(|i| match i % 3 {
                0 => format!("{{\"take\": {i}}}\n"),
                1 => format!("{{\"skip\": {i}}}\n"),
                _ => "  not an object\n".to_owned(),
            })
            .collect();
        for chunk in [1, 7, 4096, READ_BYTES * 2] {
            let (text, taken) = read_all(&input, chunk, 1 << 20);
            assert_eq!(text, input, "chunk {chunk}");
            for (index, taken) in taken.iter().enumerate() {
                let want = (index % 3 == 0).then(|| format!("{{\"take\": {index}}}"));
                assert_eq!(taken, &want, "line {} with chunk {chunk}", index + 1);
            }
        }
    }

    #[test]
    fn the_last_line_needs_no_newline() {
        let (text, taken) = read_all("{\"take\": 1}\n{\"take\": 2}", 5, 1 << 20);
        assert_eq!(text, "{\"take\": 1}\n{\"take\": 2}");
        assert_eq!(
            taken,
            [
                Some("{\"take\": 1}".to_owned()),
                Some("{\"take\": 2}".to_owned())
            ]
        );
    }

    /// A line over the limit is passed on in parts, never projected, and the lines after it
    /// keep their numbers.
    #[test]
    fn a_line_over_the_limit_is_cut_not_projected() {
        let long = format!("{{\"take\": \"{}\"}}\n", "x".repeat(READ_BYTES * 3));
        let input = format!("{{\"take\": 1}}\n{long}{{\"take\": 3}}\n");
        let (text, taken) = read_all(&input, READ_BYTES, 1000);
        assert_eq!(text, input);
        assert_eq!(
            taken,
            [
                Some("{\"take\": 1}".to_owned()),
                None,
                Some("{\"take\": 3}".to_owned())
            ]
        );
    }

    #[test]
    fn a_read_error_reaches_the_reader() {
        struct Broken;
        impl Read for Broken {
            fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
                Err(io::Error::other("disk on fire"))
            }
        }
        let mut ahead = ReadAhead::spawn(Box::new(Broken), take_marked, 1000).unwrap();
        let err = ahead.fill_buf().unwrap_err();
        assert_eq!(err.to_string(), "disk on fire");
    }
}
