// Request colours: a fixed palette, handed out in the order requests first show up (not a hash of
// the id: a hash gives two neighbours the same colour about once in every palette-size pairs).
//
// The palette is Okabe & Ito's (2008) without its black: seven colours that stay apart under the
// common colour-vision deficiencies, each at least 3:1 against the dashboard's dark canvas (the
// WCAG contrast for graphics), so none washes out on a projector.
"use strict";

const PALETTE = ["#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7"];
const COLOURS_REMEMBERED = 4096;  // ids kept; the oldest are forgotten (a server runs for hours)

class RequestColours {
  constructor(palette = PALETTE, remembered = COLOURS_REMEMBERED) {
    this.palette = palette;
    this.remembered = remembered;
    this.byId = new Map();  // id -> palette index, in arrival order
    this.next = 0;          // where the next request starts looking
    this.last = -1;         // the previous request's index: the next one never gets it
  }

  colour(id) {
    const i = this.byId.get(id);
    return i === undefined ? null : this.palette[i];
  }

  // The colour of `id`, given at its first call: the next palette colour in turn, skipping the
  // previous request's and any in `avoid` (the colours of its neighbours on the screen). With at
  // most palette.length - 2 colours to avoid, one is always left.
  assign(id, avoid = []) {
    const known = this.byId.get(id);
    if (known !== undefined) return this.palette[known];
    const n = this.palette.length;
    let pick = this.next % n;
    for (let k = 0; k < n; k++) {
      const i = (this.next + k) % n;
      if (i !== this.last && !avoid.includes(this.palette[i])) { pick = i; break; }
    }
    this.byId.set(id, pick);
    if (this.byId.size > this.remembered) this.byId.delete(this.byId.keys().next().value);
    this.last = pick;
    this.next = pick + 1;
    return this.palette[pick];
  }

  // Colours for a turnstile column (per seat: null or [id, phase]), seat by seat: a newcomer avoids
  // the colours above and below it and that of the seat's previous holder (`before`, the column
  // drawn just left of it), so neighbouring cells always differ.
  assignSeats(column, before = []) {
    const idAt = (col, seat) => (col[seat] ? col[seat][0] : null);
    column.forEach((cell, seat) => {
      if (!cell || this.byId.has(cell[0])) return;
      const avoid = [idAt(column, seat - 1), idAt(column, seat + 1), idAt(before, seat)]
        .filter((id) => id !== null && id !== cell[0]).map((id) => this.colour(id)).filter(Boolean);
      this.assign(cell[0], avoid);
    });
  }
}
