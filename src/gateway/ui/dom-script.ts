/**
 * What both pages' scripts start with (index.ts puts it first): element builders whose
 * children are elements or text, so text from sandboxes (labels, ids, output) always
 * becomes text nodes, never markup; the token (from sessionStorage, or a link's fragment,
 * which never reaches the server), the API call with it, and the status line.
 */
export const DOM_SCRIPT = String.raw`
'use strict';
const SVG = 'http://www.w3.org/2000/svg';
function make(ns, tag, attrs, kids) {
  const n = ns ? document.createElementNS(ns, tag) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    // Styles through the CSSOM: a style attribute would be inline CSS, which the policy refuses.
    if (k === 'style') Object.assign(n.style, v);
    else if (typeof v === 'function') n.addEventListener(k.replace(/^on/, ''), v);
    else n.setAttribute(k, v === true ? '' : String(v));
  }
  for (const kid of kids.flat(Infinity)) if (kid !== null && kid !== undefined && kid !== false) n.append(typeof kid === 'object' ? kid : String(kid));
  return n;
}
const el = (tag, attrs, ...kids) => make(null, tag, attrs, kids);
const svg = (tag, attrs, ...kids) => make(SVG, tag, attrs, kids);

const $ = (id) => document.getElementById(id);
const fragment = new URLSearchParams(location.hash.slice(1));
let token = fragment.get('token') || sessionStorage.getItem('rollbox.token') || '';
if (fragment.get('token')) sessionStorage.setItem('rollbox.token', token);

/** The API with the page's token; a refusal throws its code and message, with its status. */
async function call(method, path, body) {
  const headers = { authorization: 'Bearer ' + token };
  if (body !== undefined) headers['content-type'] = 'application/json';
  const r = await fetch(path, { method, cache: 'no-store', headers, body: body === undefined ? undefined : JSON.stringify(body) });
  if (!r.ok) {
    let message = r.status + ' ' + r.statusText;
    try { const b = await r.json(); if (b && b.error) message = b.error.code + ': ' + b.error.message; } catch { /* not JSON */ }
    throw Object.assign(new Error(message), { status: r.status });
  }
  return r;
}
function setStatus(text, isError) { $('status').textContent = text; $('status').className = isError ? 'error' : ''; }
`;
