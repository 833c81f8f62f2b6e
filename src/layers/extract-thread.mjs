// Entry of an extraction worker thread (see extract-workers.ts): TypeScript through tsx, as bin/rollbox.js does.
import { register } from 'tsx/esm/api';

register();
await import('./extract-thread.ts');
