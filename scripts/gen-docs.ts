// Writes the generated reference pages (docs/configuration.md, docs/errors.md). `npm run docs`.
import path from 'node:path';
import { writeGeneratedDocs } from '../src/docs/index.ts';

const changed = writeGeneratedDocs(path.resolve(import.meta.dirname, '..'));
console.log(changed.length ? `updated: ${changed.join(', ')}` : 'generated docs are up to date');
