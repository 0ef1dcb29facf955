// The console's live feed: `GET /v1/events?follow=true` read with `fetch()` streaming (an
// `EventSource` cannot send the bearer header), its server-sent events parsed here.

import { authHeaders, refusal } from './api.js';

/** Longest unfinished event frame the reader holds (characters): a longer one is refused and
 * the stream read again, so a broken proxy cannot make the page's memory grow. */
const FRAME_CAP = 64 * 1024;

/**
 * Follows the manager's events of `types` (comma-separated, e.g. `session_status,agent_status`)
 * and calls `onEvent(event)` for each (the frame's JSON), in order; `onLive(bool)` says whether
 * the stream is open. Reconnects 2 s after a failure, resuming after the last event seen
 * (`Last-Event-ID`). Returns the function that stops it.
 */
export function followEvents(types, onEvent, onLive) {
  const ctl = new AbortController();
  let lastId = null;
  const run = async () => {
    while (!ctl.signal.aborted) {
      try {
        const headers = authHeaders(lastId ? { 'Last-Event-ID': lastId } : {});
        const r = await fetch(`/v1/events?follow=true&history=false&type=${types}`, {
          headers,
          signal: ctl.signal,
          cache: 'no-store',
        });
        if (!r.ok) throw await refusal(r);
        onLive(true);
        const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
        let buf = '';
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buf += value;
          let end;
          while ((end = buf.indexOf('\n\n')) >= 0) {
            const frame = buf.slice(0, end);
            buf = buf.slice(end + 2);
            const ev = parseFrame(frame);
            if (ev) {
              if (ev.id !== undefined) lastId = String(ev.id);
              onEvent(ev);
            }
          }
          if (buf.length > FRAME_CAP) throw new Error('an event frame longer than the console takes');
        }
      } catch (e) {
        if (ctl.signal.aborted) return;
        console.warn('event stream:', String(e));
      }
      onLive(false);
      await new Promise((res) => setTimeout(res, 2000));
    }
  };
  run();
  return () => ctl.abort();
}

/** The event of one SSE frame (its `data:` lines' JSON), or null for a comment. */
export function parseFrame(frame) {
  const data = frame
    .split('\n')
    .filter((l) => l.startsWith('data:'))
    .map((l) => l.slice(5).trimStart())
    .join('\n');
  if (!data) return null;
  try {
    return JSON.parse(data);
  } catch {
    return null;
  }
}
