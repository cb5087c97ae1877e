-- Kept free for another change of the schema; nothing to do here.
SELECT 1;
