//! Natively, wgpu finishes a buffer mapping (and so every readback) only inside a poll of the
//! device. An async wait that polled on its caller's thread until the work is done would hold
//! that thread (a worker of a server's async runtime) for as long as the GPU works. Instead
//! [`Poller::done`] resolves once the submission it names has finished (when the mapping
//! callbacks of that work have run) without ever holding its thread:
//! - a sleeping wait is served by a background thread that waits on the device while some
//!   task needs it, and wakes the task;
//! - an urgent wait ([`WaitMode::Spin`]) checks the device once each time it is polled and asks
//!   to be polled again at once. Between two checks the executor runs its other tasks; with
//!   nothing else to do it comes straight back, so the waiting thread learns of the finished
//!   work within a microsecond or so. Handing that over from another thread instead (a wake-up
//!   of a parked thread) cost E2B 3% of its decode speed on an H100: its decode step waits
//!   for every token.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

#[cfg(not(target_arch = "wasm32"))]
pub(crate) use polling::Poller;

/// The lock around every submit and poll of a device. wgpu-core's device maintenance (run by
/// both) reads the finished submission index before it retires finished submissions; another
/// thread retiring newer ones in between leaves it with an empty queue and an older index,
/// and a wait then panics inside wgpu-core ("If the queue is empty, the current submission
/// index ... should be at least the wait submission index"), as the parity tests' threads did
/// on an H200.
#[derive(Default)]
pub(crate) struct Maintenance {
    lock: Mutex<()>,
    /// Threads waiting for the lock to submit or wait themselves: the polling thread, which
    /// takes it again and again, lets them go first.
    wanting: AtomicUsize,
}

impl Maintenance {
    /// Takes the lock (to submit, or to wait on the caller's thread).
    pub(crate) fn hold(&self) -> MutexGuard<'_, ()> {
        self.wanting.fetch_add(1, Ordering::SeqCst);
        let guard = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
        self.wanting.fetch_sub(1, Ordering::SeqCst);
        guard
    }

    /// Takes the lock if no thread holds it or waits for it.
    fn try_hold(&self) -> Option<MutexGuard<'_, ()>> {
        if self.wanting.load(Ordering::SeqCst) > 0 {
            return None;
        }
        match self.lock.try_lock() {
            Ok(guard) => Some(guard),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    /// Takes the lock once no other thread is waiting for it.
    fn hold_after_others(&self) -> MutexGuard<'_, ()> {
        while self.wanting.load(Ordering::SeqCst) > 0 {
            std::thread::yield_now();
        }
        self.lock.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The polling thread and the waits it serves (native: the browser polls by itself).
#[cfg(not(target_arch = "wasm32"))]
mod polling {
    use std::collections::VecDeque;
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
    use std::task::{Context, Poll, Waker};
    use std::time::Duration;

    use super::Maintenance;
    use crate::GpuError;
    use crate::gpu::{WAIT_SLICE, WaitMode};

    /// How long the polling thread stays with nothing to wait for before it ends (the next
    /// wait starts another).
    const IDLE: Duration = Duration::from_secs(2);

    enum State {
        Pending,
        Done,
        Failed(String),
    }

    /// A task waiting for a submission (`None`: everything submitted when it is polled for).
    struct Waiting {
        id: u64,
        submission: Option<wgpu::SubmissionIndex>,
        state: State,
        waker: Option<Waker>,
    }

    #[derive(Default)]
    struct Waits {
        next_id: u64,
        /// In the order the waits began; finished ones stay until their task reads them.
        list: VecDeque<Waiting>,
        /// Whether the polling thread runs.
        polling: bool,
    }

    impl Waits {
        /// The oldest pending wait's id and submission.
        fn target(&self) -> Option<(u64, Option<wgpu::SubmissionIndex>)> {
            let first = self
                .list
                .iter()
                .find(|w| matches!(w.state, State::Pending))?;
            Some((first.id, first.submission.clone()))
        }

        fn position(&self, id: u64) -> Option<usize> {
            self.list.iter().position(|w| w.id == id)
        }
    }

    struct Shared {
        device: wgpu::Device,
        maintenance: Arc<Maintenance>,
        waits: Mutex<Waits>,
        wake: Condvar,
    }

    impl Shared {
        fn waits(&self) -> MutexGuard<'_, Waits> {
            self.waits.lock().unwrap_or_else(PoisonError::into_inner)
        }

        /// Settles wait `id` and wakes its task.
        fn settle(&self, id: u64, state: State) {
            let waker = {
                let mut waits = self.waits();
                let Some(i) = waits.position(id) else { return };
                let w = &mut waits.list[i];
                w.state = state;
                w.waker.take()
            };
            if let Some(waker) = waker {
                waker.wake();
            }
        }

        /// The polling thread: waits on the device for the oldest pending wait, in slices of
        /// [`WAIT_SLICE`] (submits from other threads go between them), until none is left for
        /// [`IDLE`].
        fn run(self: Arc<Self>) {
            loop {
                let Some((id, submission)) = self.next_target() else {
                    return;
                };
                let polled = {
                    let _held = self.maintenance.hold_after_others();
                    self.device.poll(wgpu::PollType::Wait {
                        submission_index: submission,
                        timeout: Some(WAIT_SLICE),
                    })
                };
                match polled {
                    Ok(_) => self.settle(id, State::Done),
                    Err(wgpu::PollError::Timeout) => std::hint::spin_loop(),
                    Err(e) => self.settle(id, State::Failed(e.to_string())),
                }
            }
        }

        /// The wait to poll for next, sleeping while there is none; `None` (and the thread
        /// marked as gone) after [`IDLE`] without one.
        fn next_target(&self) -> Option<(u64, Option<wgpu::SubmissionIndex>)> {
            let mut waits = self.waits();
            loop {
                if let Some(t) = waits.target() {
                    return Some(t);
                }
                let (w, timeout) = self
                    .wake
                    .wait_timeout(waits, IDLE)
                    .unwrap_or_else(PoisonError::into_inner);
                waits = w;
                if timeout.timed_out() && waits.target().is_none() {
                    waits.polling = false;
                    return None;
                }
            }
        }
    }

    /// Polls a device on a background thread while tasks wait for its work.
    pub(crate) struct Poller {
        shared: Arc<Shared>,
    }

    impl Poller {
        pub(crate) fn new(device: wgpu::Device, maintenance: Arc<Maintenance>) -> Self {
            Self {
                shared: Arc::new(Shared {
                    device,
                    maintenance,
                    waits: Mutex::new(Waits::default()),
                    wake: Condvar::new(),
                }),
            }
        }

        /// Resolves once `submission` (`None`: everything submitted so far) has finished on the
        /// GPU; the callbacks of buffers mapped after that work have run by then.
        pub(crate) fn done(
            &self,
            submission: Option<wgpu::SubmissionIndex>,
            mode: WaitMode,
        ) -> Done {
            let shared = &self.shared;
            if mode == WaitMode::Spin {
                return Done {
                    shared: shared.clone(),
                    wait: Wait::Checked(submission),
                };
            }
            let mut waits = shared.waits();
            let id = waits.next_id;
            waits.next_id += 1;
            let mut state = State::Pending;
            if !waits.polling {
                let polling = shared.clone();
                match std::thread::Builder::new()
                    .name("wgemma-gpu-poll".into())
                    .spawn(move || polling.run())
                {
                    Ok(_) => waits.polling = true,
                    Err(e) => {
                        state = State::Failed(format!("cannot start the GPU polling thread: {e}"))
                    }
                }
            }
            waits.list.push_back(Waiting {
                id,
                submission,
                state,
                waker: None,
            });
            drop(waits);
            shared.wake.notify_one();
            Done {
                shared: shared.clone(),
                wait: Wait::Served(id),
            }
        }
    }

    enum Wait {
        /// Served by the polling thread, under this id.
        Served(u64),
        /// Checked on the device each time the future is polled.
        Checked(Option<wgpu::SubmissionIndex>),
    }

    /// [`Poller::done`]'s future. Dropping it gives the wait up.
    pub(crate) struct Done {
        shared: Arc<Shared>,
        wait: Wait,
    }

    impl Done {
        /// One look at the device: ready once `submission` has finished.
        fn check(
            shared: &Shared,
            submission: &Option<wgpu::SubmissionIndex>,
            cx: &mut Context<'_>,
        ) -> Poll<Result<(), GpuError>> {
            let polled = shared.maintenance.try_hold().map(|_held| {
                shared.device.poll(wgpu::PollType::Wait {
                    submission_index: submission.clone(),
                    timeout: Some(Duration::ZERO),
                })
            });
            match polled {
                Some(Ok(_)) => Poll::Ready(Ok(())),
                Some(Err(e)) if !matches!(e, wgpu::PollError::Timeout) => {
                    Poll::Ready(Err(GpuError::Readback(e.to_string())))
                }
                _ => {
                    cx.waker().wake_by_ref();
                    Poll::Pending
                }
            }
        }
    }

    impl Future for Done {
        type Output = Result<(), GpuError>;

        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
            let id = match &self.wait {
                Wait::Served(id) => *id,
                Wait::Checked(submission) => return Self::check(&self.shared, submission, cx),
            };
            let mut waits = self.shared.waits();
            let Some(i) = waits.position(id) else {
                return Poll::Ready(Ok(()));
            };
            let w = &mut waits.list[i];
            match &w.state {
                State::Pending => {
                    w.waker = Some(cx.waker().clone());
                    Poll::Pending
                }
                State::Done => {
                    waits.list.remove(i);
                    Poll::Ready(Ok(()))
                }
                State::Failed(e) => {
                    let e = GpuError::Readback(e.clone());
                    waits.list.remove(i);
                    Poll::Ready(Err(e))
                }
            }
        }
    }

    impl Drop for Done {
        fn drop(&mut self) {
            let Wait::Served(id) = self.wait else { return };
            let mut waits = self.shared.waits();
            if let Some(i) = waits.position(id) {
                waits.list.remove(i);
            }
        }
    }
}
