-- A number kept for a change made beside this one; it changes nothing here.
SELECT 1;
