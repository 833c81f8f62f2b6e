/**
 * What both pages' scripts start with (index.ts puts it first): element builders whose
 * children are elements or text, so text from sandboxes (labels, ids, output) always
 * becomes text nodes, never markup.
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
`;
