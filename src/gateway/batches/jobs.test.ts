import { describe, expect, it } from 'vitest';
import { BatchTask } from '../../api/index.ts';
import { customIdOfJob, taskJobId } from './jobs.ts';

describe('batch task job ids', () => {
  it('are valid BullMQ ids (no ":", never an integer) and give their customId back', () => {
    for (const customId of ['a', '12', 'x:y:z', 'repo.task-1_2', ':', '0:0']) {
      expect(BatchTask.shape.customId.safeParse(customId).success).toBe(true);
      const jobId = taskJobId(customId);
      expect(jobId).not.toContain(':');
      expect(`${parseInt(jobId, 10)}`).not.toBe(jobId);
      expect(customIdOfJob(jobId)).toBe(customId);
    }
  });
});
