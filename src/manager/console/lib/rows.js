// A table body kept in step with a list by key: a row is made once per key and afterwards
// only the cells whose text changed are written, so a live list of 1,000 sessions costs a
// few DOM writes per change rather than a rebuild.

import { el } from './dom.js';

/**
 * Rows of `tbody` keyed by `key(item)`. `cells(item)` answers the row's cells as
 * `[{text, class?, href?, dataset?}]` (text only: an `href` makes the cell a link); `rowData`
 * names the row's `data-*` attribute holding the key (`data-session`). `empty` is the text of the
 * one row shown when the list is empty.
 *
 * `set(items)` shows exactly `items`, in that order; `patch(key, item)` rewrites one row in place
 * (false when no row has that key); `has(key)` says whether a row shows it.
 */
export function keyedRows(tbody, { key, cells, rowData, empty }) {
  const rows = new Map(); // key -> {tr, tds}
  let emptyRow = null;

  const write = (row, item) => {
    const want = cells(item);
    while (row.tds.length < want.length) {
      const td = el('td');
      row.tds.push(td);
      row.tr.append(td);
    }
    want.forEach((c, i) => {
      const td = row.tds[i];
      const cls = c.class ?? '';
      if (td.className !== cls) td.className = cls;
      if (c.dataset) {
        for (const [k, v] of Object.entries(c.dataset)) if (td.dataset[k] !== v) td.dataset[k] = v;
      }
      const text = c.text === undefined || c.text === null ? '' : String(c.text);
      if (c.href) {
        let a = td.firstChild;
        if (!(a instanceof HTMLAnchorElement)) {
          a = el('a');
          td.replaceChildren(a);
        }
        if (a.getAttribute('href') !== c.href) a.setAttribute('href', c.href);
        if (a.textContent !== text) a.textContent = text;
      } else if (td.firstChild instanceof HTMLAnchorElement || td.textContent !== text) {
        td.textContent = text;
      }
    });
  };

  return {
    set(items) {
      const seen = new Set();
      let cursor = tbody.firstChild;
      if (emptyRow && cursor === emptyRow) {
        cursor = emptyRow.nextSibling;
        emptyRow.remove();
        emptyRow = null;
      }
      for (const item of items) {
        const k = key(item);
        seen.add(k);
        let row = rows.get(k);
        if (!row) {
          const tr = el('tr');
          tr.dataset[rowData] = k;
          row = { tr, tds: [] };
          rows.set(k, row);
        }
        write(row, item);
        if (row.tr === cursor) cursor = cursor.nextSibling;
        else tbody.insertBefore(row.tr, cursor);
      }
      for (const [k, row] of rows) {
        if (!seen.has(k)) {
          row.tr.remove();
          rows.delete(k);
        }
      }
      if (items.length === 0 && empty) {
        emptyRow = el('tr', {}, el('td', { colSpan: 99, class: 'note' }, empty));
        tbody.append(emptyRow);
      }
    },
    patch(k, item) {
      const row = rows.get(k);
      if (!row) return false;
      write(row, item);
      return true;
    },
    has(k) {
      return rows.has(k);
    },
  };
}
