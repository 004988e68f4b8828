// The turnstile's moving window: one column per refresh, the newest step the snapshot carries.
//
// The engine runs hundreds of steps a second and the page refreshes four times a second. Drawing
// every step would replace the whole picture at each refresh (the 48 steps a snapshot carries are
// a tenth of a second of engine time): nothing to read. Sampled once per refresh, the picture
// scrolls by one column at a steady pace however fast the engine runs; while it runs slower than
// the refresh (single steps, a big model) each column is exactly one step. Paused, nothing moves.
"use strict";

const TURNSTILE_COLUMNS = 48;

class TurnstileWindow {
  constructor(width = TURNSTILE_COLUMNS) {
    this.width = width;
    this.columns = [];  // [{step, seats}], oldest first, at most `width`
  }

  get lastStep() {
    return this.columns.length ? this.columns[this.columns.length - 1].step : null;
  }

  get firstStep() {
    return this.columns.length ? this.columns[0].step : null;
  }

  // Take the newest column of `turnstile` (a snapshot's [{step, seats}]) if it is a step not shown
  // yet. A step number lower than the last shown means a new server: start again. Returns whether
  // a column was added.
  push(turnstile) {
    if (!turnstile || !turnstile.length) return false;
    const newest = turnstile[turnstile.length - 1];
    const last = this.lastStep;
    if (last !== null && newest.step === last) return false;
    if (last !== null && newest.step < last) this.columns = [];
    this.columns.push(newest);
    if (this.columns.length > this.width) this.columns.splice(0, this.columns.length - this.width);
    return true;
  }

  // The mean number of steps between two columns shown (1: every step is on screen).
  stride() {
    const n = this.columns.length;
    return n < 2 ? 1 : (this.lastStep - this.firstStep) / (n - 1);
  }
}
