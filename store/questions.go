package store

import "context"

// Questioner is implemented by stores that carry questions to the live
// owner outside the event log (Ask, AnswerQuestion, ForgetQuestion): a
// table no subscription reads, cleared as questions are answered.
type Questioner interface {
	// Questions returns the questions not yet answered, oldest first.
	Questions(ctx context.Context) ([]OwnerQuestion, error)
	// Answered reports whether the owner answered question id, and its
	// answer (nil: it had none). A question not stored (never asked, or
	// forgotten) reads as not answered.
	Answered(ctx context.Context, id string) (answer []byte, answered bool, err error)
}
